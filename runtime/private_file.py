"""Files only this user may read: secrets generated on first start, in a directory only this user may enter.

A secret is created once with O_EXCL|O_NOFOLLOW and mode 0600, so a planted file or symlink is never
written through and an existing secret is never overwritten. Reads refuse symlinks and files that
another user owns or that others can read.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

from clocktower.runtime.errors import UserError


def private_dir(path: Path) -> None:
    """Create ``path`` (and parents) and make it 0700; refuse one that another user owns."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise UserError(f"{path} is not a directory: remove it, or pass another --data-dir")
    if st.st_uid != os.geteuid():
        raise UserError(f"{path} belongs to uid {st.st_uid}, not to this user ({os.geteuid()}): "
                        "pass a --data-dir of your own")
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(path, 0o700)


def write_synced(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd`` (os.write may write less than asked), then fsync it."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.fsync(fd)


def create_private_file(path: Path, data: bytes) -> bool:
    """Write ``data`` to a new 0600 file; False (and nothing written) when ``path`` already exists."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        return False
    try:
        os.fchmod(fd, 0o600)  # whatever the umask
        write_synced(fd, data)
    except BaseException:
        os.close(fd)
        path.unlink(missing_ok=True)
        raise
    os.close(fd)
    return True


def read_private_file(path: Path) -> bytes:
    """The file's bytes; UserError if it is a symlink, another user's, or readable by others."""
    def check(st: os.stat_result) -> None:
        if st.st_uid != os.geteuid():
            raise UserError(f"{path} belongs to uid {st.st_uid}, not to this user: refusing to trust it")
        if st.st_mode & 0o077:
            raise UserError(f"{path} is readable by other users (mode {stat.S_IMODE(st.st_mode):o}): chmod 600 it")
    return read_checked_file(path, check)


def read_public_file(path: Path) -> bytes:
    """A public file's bytes: world-readable is fine (a public key), but it must belong to this user or root and
    be writable by no one else, or whoever can rewrite it could swap in their own key."""
    def check(st: os.stat_result) -> None:
        if st.st_uid not in (os.geteuid(), 0):
            raise UserError(f"{path} belongs to uid {st.st_uid}, not to this user or root: refusing to trust it")
        if st.st_mode & 0o022:
            raise UserError(f"{path} is writable by other users (mode {stat.S_IMODE(st.st_mode):o}): chmod 644 it")
    return read_checked_file(path, check)


def read_checked_file(path: Path, check: Callable[[os.stat_result], None]) -> bytes:
    """A regular file's bytes, opened without following a symlink, after `check` (raising UserError) passed on
    the opened file's own stat: nothing can be swapped in between the check and the read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UserError(f"{path} is not a regular file")
        check(st)
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)
