"""The data dir: one owner at a time (a lock file), and a note telling others how to reach it."""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

from clocktower.errors import UserError
from clocktower.private_file import private_dir

LOCK = "clocktower.lock"
OWNER = "owner.json"


class DataDirLock:
    """An exclusive flock; released by the kernel even if the owner is killed."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self._fd: int | None = None

    def acquire(self) -> None:
        """Lock the dir, first making it 0700 (it holds secrets); refuses a dir another user owns."""
        private_dir(self.data_dir)
        fd = os.open(self.data_dir / LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            owner = read_owner(self.data_dir)
            who = f" by clocktower pid {owner['pid']}" if owner else ""
            raise UserError(f"data dir {self.data_dir} is in use{who}: stop it, or pass another --data-dir") from None
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            (self.data_dir / OWNER).unlink(missing_ok=True)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


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
