"""The chdb engine of one data directory, owned by this process.

chdb lets a single process own a data directory and host a single engine, so
the owner serializes every caller on one connection handle under a lock. That
handle also carries session state (current database, SET values); the engine
gives each call its own database and settings and puts back whatever a call
changed, so one request never leaks into the next, as with sessionless HTTP.
"""

from __future__ import annotations

import atexit
import fcntl
import json
import logging
import os
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import chdb
from chdb.state.sqlitelike import Connection

from sinks.endpoint.errors import READONLY, ClickHouseError
from sinks.endpoint.sql_scan import READ_ONLY_KEYWORDS, tokens

logger = logging.getLogger(__name__)

_SETTING_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Statements a readonly request may still run: ClickHouse allows them at readonly=2.
_READONLY_ALLOWED = READ_ONLY_KEYWORDS | {"SET", "USE"}
# Session state managed by USE, or emulated here, never via SET.
_NOT_SETTABLE = frozenset({"database", "readonly"})
_UNKNOWN_SETTING = 115

_open_paths: set[str] = set()
_open_paths_lock = threading.Lock()


class DataDirLocked(RuntimeError):
    """Another process owns the data directory (chdb allows one owner)."""


@dataclass(frozen=True)
class QueryResult:
    """Raw output bytes in the requested format, plus ClickHouse-style counters."""

    data: bytes
    rows_read: int = 0
    bytes_read: int = 0
    rows_written: int = 0
    bytes_written: int = 0
    elapsed_ns: int = 0


def _dir_is_locked(path: str) -> bool:
    """ClickHouse flocks ``<dir>/status`` for as long as an engine owns the directory."""
    try:
        fd = os.open(os.path.join(path, "status"), os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _locked_message(path: str) -> str:
    return f"chdb data dir {path} is locked: another clocktower process owns it"


def _quote(value: str) -> str:
    """Quote a setting value; ClickHouse converts quoted literals to the setting's type."""
    return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"


def _first_keyword(sql: str | bytes) -> str:
    raw = sql.encode() if isinstance(sql, str) else sql
    first = next(tokens(raw[:4096]), None)
    return first.text if first else ""


class ChdbEngine:
    """Owns the chdb engine for ``path``; all calls are serialized by one lock."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.path.realpath(path)
        os.makedirs(self.path, exist_ok=True)
        with _open_paths_lock:
            if self.path in _open_paths:
                raise DataDirLocked(f"chdb data dir {self.path} is already open in this process")
            if _open_paths:
                other = next(iter(_open_paths))
                raise RuntimeError(f"cannot open {self.path}: one chdb data dir per process; {other} is open")
            if _dir_is_locked(self.path):
                raise DataDirLocked(_locked_message(self.path))
            try:
                self._conn: Connection | None = chdb.connect(self.path)
            except RuntimeError as ex:
                if _dir_is_locked(self.path):
                    raise DataDirLocked(_locked_message(self.path)) from None
                raise RuntimeError(f"cannot open chdb engine at {self.path}: {ex}") from ex
            _open_paths.add(self.path)
        self._lock = threading.Lock()
        self._database: str | None = None
        self._applied: dict[str, str] = {}
        self._dirty = False
        try:
            self._baseline = self._changed_settings()
            version, timezone = self.execute("SELECT version(), timezone()").data.decode().split()
        except BaseException:
            self.close()
            raise
        self.version: str = version
        self.timezone: str = timezone
        # chdb aborts or complains at interpreter exit if its engine is still open then.
        atexit.register(self.close)

    def execute(
        self,
        sql: str | bytes,
        fmt: str = "TabSeparated",
        params: Mapping[str, str] | None = None,
        settings: Mapping[str, str] | None = None,
        database: str | None = None,
    ) -> QueryResult:
        """Run one statement; a FORMAT clause in ``sql`` wins over ``fmt``.

        ``settings`` apply to this call only. ``readonly`` is emulated (never
        SET), because a handle set to readonly could not be reset afterwards.
        """
        settings = dict(settings or {})
        keyword = _first_keyword(sql)
        readonly = settings.pop("readonly", "0")
        if readonly not in ("", "0") and keyword not in _READONLY_ALLOWED:
            raise ClickHouseError(READONLY, "Cannot execute query in readonly mode")
        with self._lock:
            if self._conn is None:
                raise ClickHouseError(1001, f"the chdb engine at {self.path} is closed")
            try:
                self._use(database or "default")
                self._apply(settings)
                result = self._query(sql, fmt, params)
            finally:
                # A SET or USE in the statement itself must not outlive it.
                if keyword == "SET":
                    self._dirty = True
                elif keyword == "USE":
                    self._database = None
        return QueryResult(
            data=result.bytes() or b"",
            rows_read=result.rows_read(),
            bytes_read=result.bytes_read(),
            rows_written=result.rows_written(),
            bytes_written=result.bytes_written(),
            elapsed_ns=int(result.elapsed() * 1e9),
        )

    def close(self) -> None:
        """Release the engine so the data dir (and chdb's one-engine slot) is free."""
        atexit.unregister(self.close)
        with self._lock:
            if self._conn is None:
                return
            try:
                self._conn.close()
            finally:
                self._conn = None
                with _open_paths_lock:
                    _open_paths.discard(self.path)

    def __enter__(self) -> ChdbEngine:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- under the lock ---------------------------------------------------------------

    def _query(self, sql: str | bytes, fmt: str, params: Mapping[str, str] | None = None) -> Any:
        assert self._conn is not None
        try:
            return self._conn.query(sql, fmt, params=dict(params or {}))
        except Exception as ex:  # chdb raises ChdbError/RuntimeError with ClickHouse's text
            raise ClickHouseError.from_engine(str(ex)) from None

    def _use(self, database: str) -> None:
        if database == self._database:
            return
        self._database = None
        quoted = "`" + database.replace("\\", "\\\\").replace("`", "\\`") + "`"
        self._query(f"USE {quoted}", "TabSeparated")
        self._database = database

    def _apply(self, settings: Mapping[str, str]) -> None:
        """Move the handle from the previous call's settings to these, touching only differences."""
        if self._dirty:
            # After a SET statement the handle state is unknown: compare it with the baseline.
            current = self._changed_settings()
            for name in current.keys() | self._baseline.keys():
                if self._baseline.get(name) != current.get(name):
                    self._applied[name] = "\0changed by SET"
            self._dirty = False
        for name in [n for n in self._applied if n not in settings]:
            self._restore(name)
        for name, value in settings.items():
            if name in _NOT_SETTABLE or self._applied.get(name) == value:
                continue
            if not _SETTING_NAME_RE.match(name):
                raise ClickHouseError(_UNKNOWN_SETTING, f"Unknown setting '{name}'", "UNKNOWN_SETTING")
            self._query(f"SET {name} = {_quote(value)}", "TabSeparated")
            self._applied[name] = value

    def _restore(self, name: str) -> None:
        baseline = self._baseline.get(name)
        del self._applied[name]
        try:
            self._query(f"SET {name} = {'DEFAULT' if baseline is None else _quote(baseline)}", "TabSeparated")
        except ClickHouseError:
            # Never fail every later request over one stuck setting; re-check the handle next time.
            logger.warning("could not reset setting %s on the chdb handle", name, exc_info=True)
            self._dirty = True

    def _changed_settings(self) -> dict[str, str]:
        sql = "SELECT name, value FROM system.settings WHERE changed"
        rows = self._query(sql, "JSONEachRow").bytes().splitlines()
        changed = (json.loads(row) for row in rows if row)
        return {row["name"]: row["value"] for row in changed if row["name"] not in _NOT_SETTABLE}
