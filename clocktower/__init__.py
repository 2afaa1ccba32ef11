"""clocktower: one import package; in a source checkout its subpackages live in the repository's top-level folders.

setup.py installs schemas/, producers/, streams/, sinks/ and actuators/ as `clocktower.schemas`, ... . In a
checkout, though, `python -m ...` puts the working directory first on sys.path, so this folder is imported as
`clocktower` and would hide the installed subpackages (and an editable install's mapping is not always there:
PYTHONPATH=. runs, a Docker WORKDIR holding the sources). So when this package is the checkout's own folder,
a finder maps those names onto the sibling folders: the checkout is then always imported as one whole.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from pathlib import Path

SUBPACKAGES = ("schemas", "runtime", "producers", "streams", "sinks", "control", "actuators")


class _CheckoutFolders(importlib.abc.MetaPathFinder):
    """Finds `clocktower.<name>` in `<root>/<name>` for the checkout's top-level folders."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def find_spec(self, fullname: str, path: object = None,
                  target: object = None) -> importlib.machinery.ModuleSpec | None:
        head, _, name = fullname.partition(".")
        if head != __name__ or name not in SUBPACKAGES:
            return None
        return importlib.machinery.PathFinder.find_spec(fullname, [str(self.root)])


def _install_checkout_finder() -> None:
    here = Path(__file__).resolve().parent
    root = here.parent
    if (here / "schemas").is_dir() or not (root / "setup.py").is_file() or not (root / "schemas").is_dir():
        return                                       # an installed package: its subpackages are inside it
    if not any(isinstance(f, _CheckoutFolders) and f.root == root for f in sys.meta_path):
        sys.meta_path.insert(0, _CheckoutFolders(root))


_install_checkout_finder()
