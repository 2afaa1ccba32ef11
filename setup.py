"""One import package, `clocktower`, built from the repository's top-level folders.

The repository keeps schemas/, producers/, streams/, sinks/ and actuators/ at its top level (the layout
DESIGN.md describes), but they install as `clocktower.schemas`, `clocktower.producers`, ... so that the
distribution adds exactly one top-level name to an environment (`schemas` alone is taken on PyPI).
Everything else about the distribution is in pyproject.toml.
"""
import ast
from pathlib import Path

from setuptools import find_packages, setup


def _subpackages() -> tuple[str, ...]:
    """clocktower/__init__.py's SUBPACKAGES, the one list of these folders (read, not imported: no finder here)."""
    tree = ast.parse((Path(__file__).resolve().parent / "clocktower" / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "SUBPACKAGES":
            return tuple(ast.literal_eval(node.value))
    raise RuntimeError("clocktower/__init__.py has no SUBPACKAGES")


SUBPACKAGES = _subpackages()

package_dir = {"clocktower": "clocktower"}
packages = ["clocktower", *(p for p in find_packages(include=["clocktower.*"]))]
for name in SUBPACKAGES:
    package_dir[f"clocktower.{name}"] = name
    packages += [f"clocktower.{p}" for p in find_packages(include=[name, f"{name}.*"])]

# Non-Python files the package needs at run time: the eBPF sources, and the drain/spare hook examples (a package
# path, not a module: hook_examples/ has no __init__.py, so it ships as data of clocktower.actuators).
package_data = {"clocktower.producers.agent.ebpf": ["*.bpf.c", "setup_bcc.sh"],
                "clocktower.actuators": ["hook_examples/*.sh", "*.bpf.c"]}
setup(packages=packages, package_dir=package_dir, package_data=package_data)
