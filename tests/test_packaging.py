"""The distribution adds one import name to an environment, under a name not taken on PyPI (issue 9 item 4)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from clocktower import SUBPACKAGES

REPO = Path(__file__).resolve().parents[1]
TOP_LEVEL_FOLDERS = SUBPACKAGES            # the one list (clocktower/__init__.py), which setup.py reads too


def _source_tree(dest: Path) -> Path:
    """The checkout's files (tracked and untracked, not ignored): no build/ leftovers can reach the wheel."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, check=True,
                            capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        if (REPO / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, dest / name)
    return dest


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = _source_tree(tmp_path_factory.mktemp("src"))
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(src)],
                   check=True, capture_output=True, timeout=300)
    (built,) = out.glob("*.whl")
    return built


def test_the_wheel_installs_exactly_the_packages_modules_under_one_top_level_name(wheel: Path) -> None:
    names = {n for n in zipfile.ZipFile(wheel).namelist() if not n.split("/")[0].endswith(".dist-info")}
    assert {n.split("/")[0] for n in names} == {"clocktower"}
    expected = {f"clocktower/{p.relative_to(REPO).as_posix()}" for folder in TOP_LEVEL_FOLDERS
                for p in (REPO / folder).rglob("*.py") if "__pycache__" not in p.parts}
    expected |= {f"clocktower/{p.relative_to(REPO / 'clocktower').as_posix()}"
                 for p in (REPO / "clocktower").rglob("*.py") if "__pycache__" not in p.parts}
    expected |= {"clocktower/producers/agent/ebpf/flows.bpf.c", "clocktower/producers/agent/ebpf/tc_flows.bpf.c",
                 "clocktower/actuators/flow_redirect.bpf.c", "clocktower/producers/agent/ebpf/setup_bcc.sh"}
    hooks = REPO / "actuators" / "hook_examples"
    expected |= {f"clocktower/actuators/hook_examples/{p.name}" for p in hooks.glob("*.sh")}
    assert len(expected) > 4 and {n for n in names if n.endswith((".py", ".c", ".sh"))} == expected


def test_the_installed_wheel_runs_from_inside_a_source_checkout(wheel: Path, tmp_path: Path) -> None:
    """`python -m` puts the working directory first: the checkout's clocktower/ folder must not hide the rest."""
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    checkout = _source_tree(tmp_path / "checkout")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site), "PYTHONNOUSERSITE": "1"}
    for cwd in (checkout, tmp_path):
        done = subprocess.run([sys.executable, "-S", "-c",
                               "import sys; sys.path.append(sys.argv[1]);"
                               "import clocktower.schemas.event as e, clocktower.sinks.endpoint.sql_scan;"
                               "print(e.__file__)", _site_packages()],
                              cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip().endswith("schemas/event.py")


def _site_packages() -> str:
    """Where the venv's dependencies are (pydantic, orjson): without the editable install's finder (-S)."""
    import pydantic
    return str(Path(pydantic.__file__).resolve().parents[1])


def test_every_package_folder_of_the_checkout_is_installed() -> None:
    folders = {p.parent.name for p in REPO.glob("*/__init__.py")} - {"clocktower", "tests"}
    assert folders == set(SUBPACKAGES), "a package folder missing from clocktower.SUBPACKAGES is not installed"


def test_the_distribution_name_is_not_the_pypi_clocktower_and_the_readme_installs_it() -> None:
    name = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["name"]
    assert name == "clocktower-telemetry"
    installs = re.findall(r"pip install '([a-z-]+)\[", (REPO / "README.md").read_text())
    assert installs and set(installs) == {name}


def test_no_code_imports_a_top_level_folder_by_its_bare_name() -> None:
    bare = re.compile(rf"(^\s*|[\"';]\s*)(from|import) ({'|'.join(TOP_LEVEL_FOLDERS)})\b", re.M)
    offenders = [str(p.relative_to(REPO)) for folder in (*TOP_LEVEL_FOLDERS, "clocktower", "tests", "benchmarks")
                 for p in (REPO / folder).rglob("*.py") if bare.search(p.read_text())]
    assert offenders == []
