"""`make lint`'s import-linter run: checks the layering contracts of pyproject.toml's [tool.importlinter].

import-linter finds a package's modules by walking its folder, but in a checkout `clocktower`'s subpackages
live in the repository's top-level folders (setup.py maps them). So this copies the sources into a temporary
tree laid out as installed (clocktower/schemas/, clocktower/runtime/, ...) and lints that.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from clocktower import SUBPACKAGES  # noqa: E402


def installed_layout(dest: Path) -> Path:
    """Copy clocktower/ and its subpackage folders' .py files into dest/clocktower; returns that folder."""
    root = dest / "clocktower"
    only_py = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "clocktower", root, ignore=only_py)
    for name in SUBPACKAGES:
        shutil.copytree(REPO / name, root / name, ignore=only_py)
    return root


def lint(tree: Path, *args: str) -> int:
    """Run lint-imports on a tree made by installed_layout's parent folder; its exit status (0: all kept)."""
    lint_imports = Path(sys.executable).with_name("lint-imports")
    cmd = [str(lint_imports), "--no-cache", "--no-logo", *args, str(REPO / "pyproject.toml")]
    return subprocess.run(cmd, cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}).returncode


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="clocktower-lint-") as tmp:
        installed_layout(Path(tmp))
        return lint(Path(tmp), *sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
