"""The chdb engine of one data directory, owned by this process.

chdb lets a single process own a data directory and host a single engine.
The owner opens several connections to it: each is a ClickHouse session, and
sessions run queries in parallel. Sessions are pooled by readonly level (0
for writers' POSTs, 2 for GETs, 1 for the read-only role), set once at the
engine's own level, so no client can lower it; inserts go first in their pool
(see session_pool). Every client statement is parsed by the engine first and
judged by sql_guard before it runs; per-request settings never outlive their
request, as with sessionless HTTP.
"""

from __future__ import annotations

import atexit
import contextlib
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

from clocktower.sinks.endpoint import engine_config, sql_guard
from clocktower.sinks.endpoint.engine_session import EngineSession
from clocktower.sinks.endpoint.errors import ACCESS_DENIED, BAD_ARGUMENTS, ClickHouseError
from clocktower.sinks.endpoint.limits import EndpointLimits
from clocktower.sinks.endpoint.session_pool import SessionPool
from clocktower.sinks.endpoint.sql_scan import tokens
from clocktower.sinks.endpoint.verdict_cache import VerdictCache

logger = logging.getLogger(__name__)

_TREELESS_RE = re.compile(r"AST node of type '([^']+)' does not support JSON serialization")
_DESCRIBED_RE = re.compile(r"\s*DESCRIBE\s+TABLE\s+(.+?)\s*\Z", re.DOTALL)
_PARSE_SCOPE_RE = re.compile(r":? In scope SELECT (?:parseQueryToJSON|formatQuery)\(.*\Z", re.DOTALL)

# Sessions start with query logging off, so their set-up stays out of system.query_log (EngineSession turns it on).
_QUIET_START = "log_queries=0"

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


def escape_param(sql: bytes) -> str:
    """A String query parameter (ClickHouse's escaped format) that the engine reads back as exactly ``sql``.

    Only printable ASCII passes as is; every other byte, and the backslash, is escaped.
    """
    out = []
    for byte in sql:
        if byte == 0x5C:
            out.append("\\\\")
        elif 0x20 <= byte < 0x7F:
            out.append(chr(byte))
        else:
            out.append(f"\\x{byte:02X}")
    return "".join(out)


def _as_bytes(sql: str | bytes) -> bytes:
    return sql.encode() if isinstance(sql, str) else sql


def _adopt_old_log(path: str) -> None:
    """A data dir from before the view keeps its log: the old table's data becomes the raw log's.

    chdb keeps no metadata for the system database, only the tables' data (``data/system/<table>``), and
    a view cannot be created where a table's data lies.
    """
    system = os.path.join(path, "data", "system")
    old, raw = os.path.join(system, "query_log"), os.path.join(system, engine_config.RAW_LOG_TABLE)
    if os.path.isdir(old):
        os.rename(old, raw if not os.path.exists(raw) else f"{old}_before_view_{os.getpid()}")


def _expose_query_log(conn: Any) -> None:
    """Make system.query_log the filtered view of the raw log (engine_config), on a connection that logs nothing."""
    try:
        conn.query("SYSTEM FLUSH LOGS")  # creates the raw table
        conn.query(engine_config.VIEW_SQL)
    except Exception as ex:  # the endpoint still serves; the warning after start says so
        logger.warning("could not set up system.query_log: %s", ex)


class ChdbEngine:
    """Owns the chdb engine for ``path`` and its pools of sessions."""

    def __init__(self, path: str | os.PathLike[str], limits: EndpointLimits | None = None) -> None:
        self.path = os.path.realpath(path)
        self.limits = limits or EndpointLimits()
        os.makedirs(self.path, exist_ok=True)
        self._sessions: list[EngineSession] = []
        self._verdicts = VerdictCache()
        self._closed = False
        self._close_lock = threading.Lock()
        with _open_paths_lock:
            if self.path in _open_paths:
                raise DataDirLocked(f"chdb data dir {self.path} is already open in this process")
            if _open_paths:
                other = next(iter(_open_paths))
                raise RuntimeError(f"cannot open {self.path}: one chdb data dir per process; {other} is open")
            if _dir_is_locked(self.path):
                raise DataDirLocked(_locked_message(self.path))
            if "?" in self.path:
                raise ValueError(f"chdb data dir {self.path!r} contains '?': chdb would read what follows as options")
            try:
                _adopt_old_log(self.path)
                with engine_config.config_file(self.limits.query_log_flush_ms, self.path) as config:
                    first = chdb.connect(f"{self.path}?config-file={config}&{_QUIET_START}")
            except RuntimeError as ex:
                if _dir_is_locked(self.path):
                    raise DataDirLocked(_locked_message(self.path)) from None
                raise RuntimeError(f"cannot open chdb engine at {self.path}: {ex}") from ex
            _open_paths.add(self.path)
        try:
            _expose_query_log(first)
            limits = self.limits
            writers = [self._session(0, limits.write_timeout_s, first)]
            writers += [self._session(0, limits.write_timeout_s) for _ in range(limits.write_sessions - 1)]
            getters = [self._session(2, limits.read_timeout_s) for _ in range(limits.get_sessions)]
            readers = [self._session(1, limits.read_timeout_s) for _ in range(limits.reader_sessions)]
            self._pools: dict[int, SessionPool[EngineSession]] = {
                0: SessionPool(writers, reserved=1, renew=self._renew),
                2: SessionPool(getters, renew=self._renew),
                1: SessionPool(readers, renew=self._renew),
            }
            startup = "SELECT version(), timezone(), getSetting('enable_http_compression') SETTINGS log_queries = 0"
            version, timezone, compression = self.execute(startup, kind="write").data.decode().split()  # no SET
        except BaseException:
            self.close()
            raise
        self._check_query_log()
        self.version: str = version
        self.timezone: str = timezone
        # What system.settings shows clients (chdb: on): clickhouse-connect sends only Accept-Encoding then.
        self.http_compression: bool = compression in ("1", "true")
        # chdb aborts or complains at interpreter exit if its engine is still open then.
        atexit.register(self.close)

    def _check_query_log(self) -> None:
        try:
            self.execute("SELECT count() FROM system.query_log LIMIT 0 SETTINGS log_queries = 0", kind="write")
        except ClickHouseError as ex:
            logger.warning("system.query_log does not work on the chdb engine at %s: %s", self.path, ex.message)

    def execute(
        self,
        sql: str | bytes,
        fmt: str = "TabSeparated",
        params: Mapping[str, str] | None = None,
        settings: Mapping[str, str] | None = None,
        database: str | None = None,
        *,
        readonly: int = 0,
        kind: str = "read",
        guard: bytes | None = None,
    ) -> QueryResult:
        """Run one statement on a session at ``readonly`` (0, 1 or 2); a FORMAT clause in ``sql`` wins.

        ``guard`` is the client's statement to judge first (for inserts, the head before the data); the
        engine parses it and sql_guard decides, and its verdict's kind (read, write, insert) sets the
        max_execution_time cap. ``kind`` is the caller's guess, for priority: inserts go first, and a
        guarded "insert" must really be one. ``settings`` apply to this call only.
        """
        settings = {k: v for k, v in (settings or {}).items() if k != "readonly"}
        if self._closed:
            raise ClickHouseError(1001, f"the chdb engine at {self.path} is closed")
        pool = self._pools[readonly if readonly in (1, 2) else 0]
        with pool.acquire(priority=kind == "insert", timeout_s=self.limits.queue_timeout_s) as session:
            session.use(database or "default")
            if guard is not None:
                sql_guard.check_params(params)
                sql_guard.check_own_statement(_as_bytes(guard))
                verdict = self._judge(session, guard, readonly)
                if verdict.session is not None:
                    return QueryResult(data=b"")  # SET/USE: nothing to keep between sessionless requests
                if kind == "insert" and verdict.kind != "insert":
                    raise ClickHouseError(ACCESS_DENIED, "The statement is not an INSERT", "ACCESS_DENIED")
                kind = verdict.kind
            cap = self.limits.timeout_for(kind)
            sql_guard.check_settings(settings, cap, self.limits.ceilings())
            if readonly == 1:
                # The engine lets no setting change at readonly=1, but Grafana sends max_execution_time with
                # every query (ClickHouse servers allow it with changeable_in_readonly): within the cap it is
                # accepted, and the session's own cap stands.
                settings.pop("max_execution_time", None)
            else:
                settings.setdefault("max_execution_time", f"{cap:g}")
            try:
                session.apply(settings)
                result = session.query(sql, fmt, params)
            finally:
                session.reset()  # at once: the next statement, and its guard's parse, run on the baseline
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
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
            try:
                for session in reversed(self._sessions):
                    try:
                        session.close()
                    except Exception:
                        logger.warning("closing a chdb session failed", exc_info=True)
            finally:
                self._sessions.clear()
                with _open_paths_lock:
                    _open_paths.discard(self.path)

    def __enter__(self) -> ChdbEngine:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _session(self, readonly: int, timeout_s: float, conn: Any = None) -> EngineSession:
        """A session at ``readonly``; at 1, with a readonly=2 parser whose parses stay out of the query log."""
        session = self._open_session(readonly, timeout_s, conn)
        if readonly == 1:
            try:
                session.parser = self._open_session(2, timeout_s)
            except BaseException:
                session.close()
                raise
        self._sessions.append(session)
        return session

    def _open_session(self, readonly: int, timeout_s: float, conn: Any = None) -> EngineSession:
        conn = conn if conn is not None else chdb.connect(f"{self.path}?{_QUIET_START}")
        try:
            return EngineSession(conn, readonly, timeout_s, self.limits.session_baseline())
        except BaseException:
            conn.close()
            raise

    def _renew(self, session: EngineSession) -> EngineSession | None:
        """``session`` if it is sound, else a fresh session at its level; None if none can be made now.

        Under the close lock, so no session is opened after ``close`` (it would keep the data dir locked)
        and ``_sessions`` never changes while ``close`` goes through it.
        """
        if session.sound:
            return session
        with self._close_lock:
            if self._closed:
                return None
            try:
                fresh = self._session(session.readonly, session.timeout_s)
            except Exception:
                logger.exception("could not replace a broken chdb session; its pool will retry")
                return None
            with contextlib.suppress(ValueError):
                self._sessions.remove(session)
            try:
                session.close()
            except Exception:
                logger.warning("closing a broken chdb session failed", exc_info=True)
        logger.warning("replaced a broken chdb session (readonly=%d)", session.readonly)
        return fresh

    def _judge(self, session: EngineSession, statement: bytes, readonly: int) -> sql_guard.Verdict:
        """The guard's verdict on ``statement``: remembered for an exact repeat, else judged afresh."""
        statement = _as_bytes(statement)
        verdict = self._verdicts.get(statement, readonly)
        if verdict is None:
            verdict = self._judge_afresh(session, statement, readonly)
            self._verdicts.put(statement, readonly, verdict)
        return verdict

    def _judge_afresh(self, session: EngineSession, statement: bytes, readonly: int) -> sql_guard.Verdict:
        """Parse ``statement`` with the engine (never running it) and let sql_guard judge the tree.

        The statement travels as a query parameter, so it cannot end the query that parses it; the
        parser refuses a second statement. A DESCRIBE has no tree, but its table expression is judged as
        one (as ``SELECT * FROM <it>``): the engine evaluates scalar subqueries and table functions there.
        """
        session = session.parser
        try:
            return self._judge_tree(session, statement, readonly)
        except ClickHouseError as ex:
            found = _TREELESS_RE.search(ex.message) if ex.code == BAD_ARGUMENTS else None
            if found is None:
                raise
        param = {"q": escape_param(statement)}
        formatted = session.query(engine_config.FORMAT_SQL + session.quiet, "TSVRaw", param).bytes()
        toks = list(tokens(formatted))
        calls = (t.text for t, nxt in zip(toks, toks[1:], strict=False) if nxt.text == "(" and t.text)
        text = formatted.decode("utf-8", "replace")
        verdict = sql_guard.check_treeless(found.group(1), calls, readonly, text)
        table = _DESCRIBED_RE.match(text)
        if found.group(1) == "DescribeQuery":
            if table is None:
                raise ClickHouseError(ACCESS_DENIED, "This DESCRIBE cannot be judged on the embedded endpoint",
                                      "ACCESS_DENIED")
            self._judge_tree(session, b"SELECT * FROM " + table.group(1).encode(), readonly)
        return verdict

    def _judge_tree(self, session: EngineSession, statement: bytes, readonly: int) -> sql_guard.Verdict:
        param = {"q": escape_param(statement)}
        try:
            parsed = session.query(engine_config.PARSE_SQL + session.quiet, "TSVRaw", param).bytes()
        except ClickHouseError as ex:
            raise ClickHouseError(ex.code, _PARSE_SCOPE_RE.sub("", ex.message), ex.name) from None
        return sql_guard.check_tree(json.loads(parsed), readonly, self.limits.timeout_for, self.limits.ceilings())
