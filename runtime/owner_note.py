"""The data dir's owner note (owner.json): how the running `clocktower up` is reached, for every process that reads it.

The owner (clocktower/data_dir.py's lock holder) writes it; the CLI and the services' settings read it, e.g. to
tell whether a ClickHouse URL is the data dir's own embedded endpoint, whose generated login may be used.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

OWNER = "owner.json"


def write_owner(data_dir: Path, info: dict) -> None:
    tmp = data_dir / (OWNER + ".tmp")
    tmp.write_text(json.dumps({"pid": os.getpid(), **info}))
    tmp.replace(data_dir / OWNER)


def read_owner(data_dir: Path) -> dict | None:
    """The running owner's note, or None when nobody (alive) owns the dir."""
    try:
        info = json.loads((data_dir / OWNER).read_text())
        os.kill(int(info["pid"]), 0)
        return info
    except (OSError, ValueError, KeyError):
        return None
