"""docker-compose.yml is valid Compose, and every command it runs exists here and answers `--help`.

There is no Docker engine on the build machines. The file is checked against the Compose Specification's own
JSON Schema (tests/data/compose-spec.json, from compose-spec/compose-spec, Apache-2.0), and each service command
of this project's image is run here with `--help` in its place of the service's own arguments (a `python -c`
snippet: its imports), so a renamed module or option fails here, not at `docker compose up`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SCHEMA = json.loads((ROOT / "tests" / "data" / "compose-spec.json").read_text())
BIN = Path(sys.executable).parent


def test_the_compose_file_is_valid_against_the_compose_specification() -> None:
    errors = sorted(jsonschema.Draft7Validator(SCHEMA).iter_errors(COMPOSE), key=lambda e: list(e.path))
    assert not errors, [f"{'/'.join(map(str, e.path))}: {e.message}" for e in errors]


def test_the_schema_catches_a_broken_file() -> None:
    broken = {**COMPOSE, "services": {**COMPOSE["services"], "sink": {**COMPOSE["services"]["sink"], "ports": 8123}}}
    assert list(jsonschema.Draft7Validator(SCHEMA).iter_errors(broken))


OURS = {name: s["command"] for name, s in COMPOSE["services"].items() if "build" in s and "command" in s}


def _help_argv(command: list[str]) -> list[str]:
    """The command with `--help` in place of the service's arguments (`python -c CODE`: only CODE's imports)."""
    program, *args = command
    if program == "python" and args[0] == "-c":
        imports = "\n".join(line for line in re.split(r";\s*", args[1]) if line.startswith(("from ", "import ")))
        return [sys.executable, "-c", imports]
    if program == "python" and args[0] == "-m":
        return [sys.executable, "-m", args[1], "--help"]
    return [str(BIN / program), *args, "--help"]


@pytest.mark.parametrize("service", sorted(OURS))
def test_every_command_of_our_image_runs_with_help(service: str, tmp_path: Path) -> None:
    assert len(OURS) >= 4, OURS   # topics, sink, streams, agent
    argv = _help_argv(OURS[service])
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLOCKTOWER_")}
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env)
    assert out.returncode == 0, (argv, out.stderr[-2000:])
    if argv[-1] == "--help":
        assert out.stdout.startswith("usage:"), out.stdout[:500]
