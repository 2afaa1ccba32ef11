"""The engine's start-up configuration: system.query_log, which chdb leaves off, as a filtered view.

Grafana's ClickHouse plugin and users read system.query_log. chdb starts without one, so the first
connection passes a config file (``?config-file=``; chdb hands it to the engine as clickhouse-local's
config). The engine writes every statement to ``system.query_log_raw``, the endpoint's own among them
(SET/reset of per-request settings, flush markers, ``INSERT ... FROM INFILE`` with the spool path) and
the sink's ``insert_deduplication_token``. Clients see ``system.query_log``, a view
that leaves those out; sql_guard refuses any statement that names the raw table. Both keep
``QUERY_LOG_DAYS`` days.

chdb reads the part of its connection string after ``?`` as a URL query (``+`` becomes a space, ``%xx``
is decoded, ``&`` splits), so the config file lives under a path of plain characters only.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

QUERY_LOG_DAYS = 7
RAW_LOG_TABLE = "query_log_raw"
SPOOL_PREFIX = "clocktower-insert-"
SPOOL_SHOWN = "<request body>"
_SAFE_PATH_RE = re.compile(r"[A-Za-z0-9_./-]+")
_CONFIG = """<clickhouse>
    <query_log>
        <database>system</database>
        <table>{table}</table>
        <ttl>event_date + INTERVAL {days} DAY DELETE</ttl>
        <flush_interval_milliseconds>{flush_ms}</flush_interval_milliseconds>
    </query_log>
</clickhouse>
"""
# The guard's parse, never logged: it runs with log_queries=0 (at readonly=1, on the session's own parser).
PARSE_SQL = "SELECT parseQueryToJSON({q:String})"
FORMAT_SQL = "SELECT formatQuery({q:String})"
# The flush after a failed query, logged on readonly=1 sessions (they cannot turn logging off per query). The
# view leaves out exactly this text (session-level SETs aside: clients' SET and USE never reach the engine), and
# engine refuses it from clients, so no client statement hides from the view.
FLUSH_SQL = "SELECT 'clocktower-session-flush'"
OWN_STATEMENTS = frozenset({FLUSH_SQL})
_OWN_STATEMENTS = (
    "query_kind != 'Set'",
    "query NOT IN (" + ", ".join("'" + sql.replace("'", "\\'") + "'" for sql in sorted(OWN_STATEMENTS)) + ")",
)
# A spool file's path, as a ClickHouse string literal: no space or quote in it, then the name tempfile gives it.
_SPOOL_RE = r"[^\\s\']*" + SPOOL_PREFIX + r"[A-Za-z0-9_]+\\.data"
_HIDE_SPOOL = f"replaceRegexpAll({{col}}, '{_SPOOL_RE}', '{SPOOL_SHOWN}') AS {{col}}"
VIEW_SQL = (
    "CREATE OR REPLACE VIEW system.query_log AS SELECT * REPLACE ("
    + ", ".join(_HIDE_SPOOL.format(col=col) for col in ("query", "formatted_query", "exception", "stack_trace"))
    + ", mapFilter((k, v) -> k != 'insert_deduplication_token', Settings) AS Settings"
    + f") FROM system.{RAW_LOG_TABLE} WHERE " + " AND ".join(_OWN_STATEMENTS)
)


def is_safe_path(path: str) -> bool:
    """True when chdb's connection string carries ``path`` unchanged after ``?``."""
    return _SAFE_PATH_RE.fullmatch(path) is not None


def _config_dir(data_dir: str) -> str:
    """A fresh private directory under a plain path: the temp dir, else the data dir, else /tmp."""
    for parent in (tempfile.gettempdir(), data_dir, "/tmp"):
        if is_safe_path(parent) and os.path.isdir(parent) and os.access(parent, os.W_OK):
            return tempfile.mkdtemp(prefix="clocktower-engine-", dir=parent)
    raise RuntimeError(f"no directory with a plain path (characters {_SAFE_PATH_RE.pattern}) for the engine config")


@contextmanager
def config_file(flush_ms: int, data_dir: str) -> Iterator[str]:
    """The path of a config file that turns the query log on, for as long as the block runs."""
    folder = _config_dir(data_dir)
    try:
        path = os.path.join(folder, "config.xml")
        with open(path, "w", encoding="utf-8") as out:
            out.write(_CONFIG.format(table=RAW_LOG_TABLE, days=QUERY_LOG_DAYS, flush_ms=int(flush_ms)))
        yield path
    finally:
        shutil.rmtree(folder, ignore_errors=True)
