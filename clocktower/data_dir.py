"""The data dir: one owner at a time (a lock file), and a note telling others how to reach it."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from clocktower.runtime.errors import UserError
from clocktower.runtime.owner_note import OWNER, read_owner
from clocktower.runtime.private_file import private_dir

LOCK = "clocktower.lock"


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
