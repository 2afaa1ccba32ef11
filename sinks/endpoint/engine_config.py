"""The engine's start-up configuration: system.query_log, which chdb leaves off.

Grafana's ClickHouse plugin and users read system.query_log. chdb starts without one, so the first
connection passes this file (``?config-file=``; chdb hands it to the engine as clickhouse-local's
config). The table lives in the data directory's ``system`` database and keeps ``QUERY_LOG_DAYS`` days.
The file is written to a private temporary directory and removed once the engine has read it.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

QUERY_LOG_DAYS = 7
_CONFIG = """<clickhouse>
    <query_log>
        <database>system</database>
        <table>query_log</table>
        <ttl>event_date + INTERVAL {days} DAY DELETE</ttl>
        <flush_interval_milliseconds>{flush_ms}</flush_interval_milliseconds>
    </query_log>
</clickhouse>
"""


@contextmanager
def config_file(flush_ms: int) -> Iterator[str]:
    """The path of a config file that turns system.query_log on, for as long as the block runs."""
    with tempfile.TemporaryDirectory(prefix="clocktower-engine-") as folder:
        path = os.path.join(folder, "config.xml")
        with open(path, "w", encoding="utf-8") as out:
            out.write(_CONFIG.format(days=QUERY_LOG_DAYS, flush_ms=int(flush_ms)))
        yield path
