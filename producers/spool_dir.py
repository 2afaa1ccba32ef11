"""The spool's directory, opened so that nobody else's file or link can be written through it.

Why: the spool runs as root on nodes, often under a shared parent (/var/tmp, a home dir). A planted
symlink at the next segment name or at `cursor.tmp` once made the agent append spool data to one
victim file and overwrite another. So:

* the directory is pinned by a file descriptor opened O_NOFOLLOW (the last path component may not be
  a link), must be owned by us, and is set to 0700; every later call works relative to that descriptor,
  so swapping a parent directory afterwards changes nothing;
* new files are created O_CREAT|O_EXCL|O_NOFOLLOW|O_CLOEXEC, 0600: never an existing file, never a link;
* reads open O_NOFOLLOW and accept regular files only;
* a file is replaced by writing a fresh temporary file (O_EXCL) and renaming it over the old one.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from clocktower.runtime.private_file import write_synced

DIR_MODE = 0o700
FILE_MODE = 0o600
_NEW = os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC


class SpoolInUse(RuntimeError):
    """This spool directory cannot be ours: another process (or another Spool in this one) has it open."""


class SpoolDirUnsafe(SpoolInUse):
    """The spool directory is a link, not a directory, or owned by someone else: refused.

    A SpoolInUse, so callers that already pick another directory (or stop with a clear error) when the
    spool is taken do the same here."""


class SpoolDir:
    """A directory held open by descriptor; names passed to its methods are plain file names in it."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            self.path.mkdir(mode=DIR_MODE)
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:   # ELOOP: a symlink; ENOTDIR: a file
            raise SpoolDirUnsafe(f"spool directory {self.path} is not a plain directory ({exc.strerror}): "
                                 "refusing to use it; remove it or pick another spool directory") from None
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            os.close(fd)
            raise SpoolDirUnsafe(f"spool directory {self.path} is owned by uid {st.st_uid}, not by us "
                                 f"(uid {os.geteuid()}): refusing to use it; pick a directory of our own")
        if stat.S_IMODE(st.st_mode) != DIR_MODE:
            os.fchmod(fd, DIR_MODE)
        self.fd: int | None = fd

    def _dfd(self) -> int:
        if self.fd is None:
            raise ValueError(f"spool directory {self.path} is closed")
        return self.fd

    def create(self, name: str, flags: int = os.O_WRONLY) -> int:
        """A new file, 0600; FileExistsError when anything (a file, a link) is already at `name`."""
        return os.open(name, flags | _NEW, FILE_MODE, dir_fd=self._dfd())

    def open_lock(self, name: str) -> int:
        """Open or create a lock file (it is reused across runs), never through a link."""
        return os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE, dir_fd=self._dfd())

    def read(self, name: str, offset: int = 0, size: int = -1) -> bytes:
        """The bytes of a regular file (all, or `size` from `offset`); OSError for a link or anything else."""
        fd = os.open(name, _READ, dir_fd=self._dfd())
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise OSError(f"{name} is not a regular file")
            want = st.st_size - offset if size < 0 else size
            chunks, pos = [], offset
            while want > 0:
                chunk = os.pread(fd, min(want, 1 << 24), pos)
                if not chunk:
                    break
                chunks.append(chunk)
                pos += len(chunk)
                want -= len(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)

    def names(self, suffix: str) -> list[str]:
        """File names in the directory ending with `suffix`, sorted."""
        return sorted(n for n in os.listdir(self._dfd()) if n.endswith(suffix))

    def unlink(self, name: str) -> None:
        """Remove a name (a link is removed itself, never its target); missing is fine."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=self._dfd())

    def replace(self, name: str, data: bytes) -> None:
        """Write `data` to `name` atomically: a fresh `name.tmp` (O_EXCL), fsynced, then renamed over."""
        tmp = name + ".tmp"
        self.unlink(tmp)                        # a stale one from a crash, or a planted link: the name only
        fd = self.create(tmp)
        try:
            write_synced(fd, data)
        except BaseException:
            os.close(fd)
            self.unlink(tmp)
            raise
        os.close(fd)
        os.replace(tmp, name, src_dir_fd=self._dfd(), dst_dir_fd=self._dfd())

    def fsync(self) -> None:
        os.fsync(self._dfd())

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
