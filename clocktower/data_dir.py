"""The data dir: one owner at a time (a lock file), a note telling others how to reach it, and nothing in it that
someone else planted.

`up --data-dir` given a symlink once made its target 0700 and filled it with secrets (with root and a link to
/etc, that breaks the machine), and in a data dir others could write to, a planted `logs/broker.log` symlink had
the broker's log appended to its target and the broker used a `kafka/` dir the planter owned (issue 18). So the
path is checked with lstat before it is resolved, every directory the stack writes in is made 0700 and refused
when it is a symlink or another user's, and logs are opened without following a symlink.
"""

from __future__ import annotations

import fcntl
import os
import stat
from pathlib import Path

from clocktower.runtime.errors import UserError
from clocktower.runtime.owner_note import OWNER, read_owner
from clocktower.runtime.private_file import private_dir

LOCK = "clocktower.lock"
SUBDIRS = ("logs", "kafka", "clickhouse", "streams")   # what the stack and its children write under the data dir


def checked_data_dir(path: Path) -> Path:
    """`path` resolved, after refusing a symlink there (checked before resolving: resolving follows it)."""
    if path.is_symlink():
        raise UserError(f"data dir {path} is a symlink (to {os.readlink(path)}): pass the real directory")
    return path.resolve()


def private_subdirs(data_dir: Path) -> None:
    """The data dir and its SUBDIRS, made 0700; UserError for any that is a symlink, not a directory, or another
    user's (private_dir)."""
    private_dir(data_dir)
    for name in SUBDIRS:
        private_dir(data_dir / name)


def open_log(path: Path) -> int:
    """A log file opened to append (0600 if new), never through a symlink; UserError for one that is another
    user's or not a regular file. Returns the fd."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise UserError(f"cannot open the log {path}: {exc.strerror or exc} (a symlink there is refused)") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        raise UserError(f"the log {path} is not a regular file of this user's: remove it")
    return fd


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
