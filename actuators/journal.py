"""An append-only file of JSON lines, fsynced per append: the actuator's memory across restarts.

Why not a database: the actuator appends a few lines per command and reads the whole file once, on start.
Each append is one `write` of one line followed by `fsync`, so after a crash (kill -9, power loss) the file
holds every line whose append returned, and at most one torn line at its end. `load()` ignores lines that
are not JSON objects (a torn one) and `rewrite()` replaces the file atomically (temporary file, fsync,
rename, fsync of the directory), which both compacts it and repairs a torn end. Not thread-safe by itself:
the stores that use it hold their own lock.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson

from clocktower.runtime.private_file import private_dir, write_synced

log = logging.getLogger(__name__)


class Journal:
    """JSON-lines file at `path` (its directory is created 0700)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        private_dir(path.parent)
        self.skipped = 0        # lines ignored by the last load (torn or corrupt)
        self._fd: int | None = None

    def load(self) -> list[dict[str, Any]]:
        """Every well-formed entry, in order; a torn or corrupt line is skipped, logged and counted."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return []
        entries: list[dict[str, Any]] = []
        self.skipped = 0
        for n, line in enumerate(raw.split(b"\n"), 1):
            if not line.strip():
                continue
            try:
                entry = orjson.loads(line)
            except orjson.JSONDecodeError:
                entry = None
            if isinstance(entry, dict):
                entries.append(entry)
            else:
                self.skipped += 1
                log.warning("%s: line %d is not a JSON object (torn by a crash?); ignored", self.path, n)
        return entries

    def rewrite(self, entries: Iterable[dict[str, Any]]) -> None:
        """Replace the file's content with `entries`, atomically; later appends go to the new file."""
        self.close()
        tmp = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            write_synced(fd, b"".join(orjson.dumps(e) + b"\n" for e in entries))
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        self._sync_dir()

    def append(self, entry: dict[str, Any]) -> None:
        """Add one line and fsync it: when this returns, the entry survives a crash."""
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                               0o600)
        write_synced(self._fd, orjson.dumps(entry) + b"\n")

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _sync_dir(self) -> None:
        fd = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
