"""The import-linter contracts `make lint` runs: the services and the shared runtime never import the CLI modules.

Each test lints a copy of the sources laid out as installed (scripts/lint_imports.py), so a planted import
shows that the contracts do catch what they are for.
"""

from __future__ import annotations

import importlib.util
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("lint_imports", ROOT / "scripts/lint_imports.py")
lint_imports = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lint_imports)

pytestmark = pytest.mark.skipif(not (Path(lint_imports.sys.executable).with_name("lint-imports")).exists(),
                                reason="import-linter is not installed (pip install -e '.[dev]')")


def contracts() -> list[dict]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def test_every_cli_module_is_forbidden_to_the_services() -> None:
    forbidden = next(c for c in contracts() if c["name"].endswith("import no CLI module"))["forbidden_modules"]
    cli_modules = {f"clocktower.{p.stem}" for p in (ROOT / "clocktower").glob("*.py") if p.stem != "__init__"}
    cli_modules |= {f"clocktower.{p.parent.name}" for p in (ROOT / "clocktower").glob("*/__init__.py")}
    assert set(forbidden) == cli_modules


def test_the_checkout_keeps_the_contracts(tmp_path: Path) -> None:
    lint_imports.installed_layout(tmp_path)
    assert lint_imports.lint(tmp_path) == 0


@pytest.mark.parametrize(("module", "planted"), [
    ("streams/app.py", "from clocktower.config import Settings"),          # a service importing the CLI
    ("sinks/endpoint/__main__.py", "from clocktower import generated_secrets"),
    ("runtime/settings.py", "import clocktower.streams.settings"),         # a lower layer importing a higher one
    ("control/__init__.py", "import clocktower.streams"),
    ("sinks/clickhouse/__main__.py", "import clocktower.streams.settings"),  # two services depending on each other
    ("streams/joins/flow_latency.py", "import aiokafka"),                  # pure stream logic speaking to a broker
    ("streams/topology.py", "from clocktower.streams.engine import faust_worker"),   # the router on the engine
])
def test_a_planted_import_breaks_a_contract(tmp_path: Path, module: str, planted: str) -> None:
    root = lint_imports.installed_layout(tmp_path)
    path = root / module
    path.write_text(path.read_text() + f"\n{planted}  # noqa\n")
    assert lint_imports.lint(tmp_path) != 0
