"""One chdb connection: a ClickHouse session at a fixed readonly level.

chdb connections to one data dir share the engine but each is its own
session (settings, current database) and they run in parallel. A session's
readonly level is set once, at the engine's own level, before any client
runs on it: the engine then enforces it, and nothing a client sends can lower
it. Per-request settings are applied just before the client's query and put
back to the session's baseline right after it (in ``finally``), so none
outlives its request and the guard always parses under the baseline. A session
whose flush or reset fails is ``broken``: its pool closes and replaces it.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from typing import Any

from chdb.state.sqlitelike import Connection

from clocktower.sinks.endpoint.engine_config import FLUSH_SQL
from clocktower.sinks.endpoint.errors import ClickHouseError

logger = logging.getLogger(__name__)

_SETTING_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_UNKNOWN_SETTING = 115
_FLUSH_SQL, _FLUSH_OUT = FLUSH_SQL, b"clocktower-session-flush\n"
# Never set per request: the session's level, and the database (set by USE).
_NOT_SETTABLE = frozenset({"database", "readonly"})
# Every session starts with these: Values data never evaluates expressions (they could call functions), and
# introspection functions (addressToSymbol, demangle, ...; chdb turns them on) cannot read the process's memory map.
BASELINE_SETTINGS = {
    "input_format_values_interpret_expressions": "0",
    "input_format_values_deduce_templates_of_expressions": "0",
    "allow_introspection_functions": "0",
}


def quote(value: str) -> str:
    """Quote a setting value; ClickHouse converts quoted literals to the setting's type."""
    return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"


class EngineSession:
    """A chdb connection at ``readonly`` (0, 1 or 2), with its timeout cap and ``baseline`` (resource caps) set."""

    def __init__(
        self, conn: Connection, readonly: int, timeout_s: float, baseline: Mapping[str, str] | None = None
    ) -> None:
        self.conn = conn
        self.readonly = readonly
        self.timeout_s = timeout_s
        self._database: str | None = None
        self._applied: dict[str, str] = {}
        self.broken = False
        self.quiet = ""
        # Where the guard parses this session's statements: itself, where its parse can go unlogged; a readonly=1
        # session cannot turn logging off per query, so the engine gives it a quiet companion (see ChdbEngine).
        self.parser: EngineSession = self
        # The engine opens the connection with log_queries=0, so this set-up stays out of system.query_log; the
        # last SET turns logging on (unlogged itself) and, after readonly, no setting can change (at 1) or lower.
        self.baseline = dict(baseline or {})
        for name, value in {**BASELINE_SETTINGS, **self.baseline, "max_execution_time": f"{timeout_s:g}"}.items():
            self.query(f"SET {name} = {quote(value)}")
        self.use("default")
        self._baseline = self._changed_settings()
        self._baseline.pop("log_queries", None)
        self.query("SET log_queries = 1" + (f", readonly = {readonly}" if readonly else ""))
        # The endpoint's own SELECTs (guard parse, flush) stay out of the log where the session may say so.
        self.quiet = " SETTINGS log_queries = 0" if readonly != 1 else ""

    def query(self, sql: str | bytes, fmt: str = "TabSeparated", params: Mapping[str, str] | None = None) -> Any:
        try:
            return self.conn.query(sql, fmt, params=dict(params or {}))
        except Exception as ex:  # chdb raises ChdbError/RuntimeError with ClickHouse's text
            error = ClickHouseError.from_engine(str(ex))
        self._flush()
        raise error

    def _flush(self) -> None:
        """Drop output a failed query left behind.

        chdb 4.4 prepends what a query had produced before it failed (e.g. on TIMEOUT_EXCEEDED) to the
        next result on the same connection: the next request, maybe another client's, would get it.
        """
        for _ in range(3):
            try:
                if self.conn.query(_FLUSH_SQL + self.quiet, "TSVRaw").bytes() == _FLUSH_OUT:
                    return
            except Exception:
                logger.warning("flushing a chdb session failed", exc_info=True)
        self.broken = True
        raise ClickHouseError(1001, "a chdb session could not be flushed after an error")

    def use(self, database: str) -> None:
        if database == self._database:
            return
        self._database = None
        quoted = "`" + database.replace("\\", "\\\\").replace("`", "\\`") + "`"
        self.query(f"USE {quoted}")
        self._database = database

    def apply(self, settings: Mapping[str, str]) -> None:
        """Set this request's settings (one SET); ``reset`` must follow, whatever happens.

        At readonly=1 the engine itself refuses any change (as ClickHouse does); same-value settings pass.
        A setting already at the session's baseline value is not sent: every engine call costs a round trip
        (about 1-2 ms), and reads would otherwise pay two more (SET, then reset) for their own timeout cap.
        """
        changes = {n: v for n, v in settings.items() if n not in _NOT_SETTABLE and self._baseline.get(n) != str(v)}
        for name in changes:
            if not _SETTING_NAME_RE.match(name):
                raise ClickHouseError(_UNKNOWN_SETTING, f"Unknown setting '{name}'", "UNKNOWN_SETTING")
        if not changes:
            return
        if self.readonly != 1:  # at readonly=1 only same-value SETs pass: nothing to put back
            self._applied.update(changes)
        self.query("SET " + ", ".join(f"{name} = {quote(value)}" for name, value in changes.items()))

    def reset(self) -> None:
        """Put every setting ``apply`` changed back to the baseline; on failure the session is ``broken``."""
        if not self._applied:
            return
        names = list(self._applied)
        sql = "SET " + ", ".join(
            f"{name} = {'DEFAULT' if self._baseline.get(name) is None else quote(self._baseline[name])}"
            for name in names
        )
        try:
            self.query(sql)
        except ClickHouseError:  # keep _applied: these settings may still be in force
            logger.warning("could not reset settings %s on a chdb session: replacing it", names, exc_info=True)
            self.broken = True
            return
        self._applied = {}

    @property
    def sound(self) -> bool:
        """Neither this session nor its parser is broken."""
        return not self.broken and not self.parser.broken

    def close(self) -> None:
        try:
            if self.parser is not self:
                self.parser.close()
        finally:
            self.conn.close()

    def _changed_settings(self) -> dict[str, str]:
        sql = "SELECT name, value FROM system.settings WHERE changed"
        rows = self.query(sql, "JSONEachRow").bytes().splitlines()
        changed = (json.loads(row) for row in rows if row)
        return {row["name"]: row["value"] for row in changed if row["name"] not in _NOT_SETTABLE}
