"""Embedded ClickHouse (chdb) served over ClickHouse's HTTP protocol.

One process owns the chdb data dir (chdb allows no other); it runs
:class:`ChdbEngine` and :class:`ClickHouseHttpEndpoint`, and every other
process, Grafana included, talks to it as to a ClickHouse server.
"""

from clocktower.sinks.endpoint.engine import ChdbEngine, DataDirLocked, QueryResult
from clocktower.sinks.endpoint.errors import ClickHouseError
from clocktower.sinks.endpoint.http_server import ClickHouseHttpEndpoint, PortInUse

__all__ = [
    "ChdbEngine",
    "ClickHouseError",
    "ClickHouseHttpEndpoint",
    "DataDirLocked",
    "PortInUse",
    "QueryResult",
]
