"""The distribution adds one import name to an environment, under a name not taken on PyPI (issue 9 item 4)."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TOP_LEVEL_FOLDERS = ("schemas", "producers", "streams", "sinks", "actuators")


def test_the_wheel_installs_one_top_level_package_with_every_module(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w",
                    str(tmp_path), str(REPO)], check=True, capture_output=True, timeout=300)
    (wheel,) = tmp_path.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")} == {"clocktower"}
    for folder in TOP_LEVEL_FOLDERS:           # every source file of every folder is in the wheel, renamed
        for source in (REPO / folder).rglob("*.py"):
            assert f"clocktower/{source.relative_to(REPO).as_posix()}" in names, source
    assert "clocktower/producers/agent/ebpf/flows.bpf.c" in names


def test_the_distribution_name_is_not_the_pypi_clocktower_and_the_readme_installs_it() -> None:
    name = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["name"]
    assert name == "clocktower-telemetry"
    installs = re.findall(r"pip install '([a-z-]+)\[", (REPO / "README.md").read_text())
    assert installs and set(installs) == {name}


def test_no_code_imports_a_top_level_folder_by_its_bare_name() -> None:
    bare = re.compile(rf"^\s*(from|import) ({'|'.join(TOP_LEVEL_FOLDERS)})\b", re.M)
    offenders = [str(p.relative_to(REPO)) for folder in (*TOP_LEVEL_FOLDERS, "clocktower", "tests", "benchmarks")
                 for p in (REPO / folder).rglob("*.py") if bare.search(p.read_text())]
    assert offenders == []
