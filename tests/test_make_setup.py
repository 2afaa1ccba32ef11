"""`make demo` must not install torch (~750 MB, the demo never imports it); `make test` must, for the
training-script integration's tests. Checked with `make -n -B` (print every command, run none)."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")


def extras(requirement_list: list[str]) -> set[str]:
    return {re.split(r"[=<>!~\[; ]", r, maxsplit=1)[0].lower() for r in requirement_list}


def pip_installs(target: str) -> list[str]:
    out = subprocess.run(["make", "-n", "-B", target], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if "pip install" in line and "--upgrade pip" not in line]


def installed_extras(target: str) -> set[str]:
    found: set[str] = set()
    for line in pip_installs(target):
        found |= {e for m in re.finditer(r"\.\[([^\]]*)\]", line) for e in m.group(1).split(",")}
    return found


def test_demo_installs_no_torch_and_test_does() -> None:
    optional = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert "torch" in extras(optional["pytorch"])
    demo = installed_extras("demo")
    assert demo == {"dev"}, demo
    assert all("torch" not in extras(optional[e]) for e in demo), "an extra `make demo` installs pulls torch"
    assert "pytorch" in installed_extras("test")
