"""Brings a ClickHouse database to the schema the models and the migrations describe (schemas/migrations.py).

Runs at the sink's start, before its first insert: creates what is missing, reconciles columns with the models,
then runs the migrations not yet recorded (each recorded once all its statements ran; one cut short is run again,
its statements being idempotent). Logs each step, so an operator sees what an upgrade did to their tables.
"""

from __future__ import annotations

import logging
import os
import socket
from datetime import UTC, datetime

from clickhouse_connect.driver.client import Client

from clocktower.schemas.clickhouse_ddl import ONE_SERVER, Layout
from clocktower.schemas.migrations import (
    BOOKKEEPING,
    MIGRATIONS,
    Catalog,
    Migration,
    create_sql,
    reconcile_columns_sql,
)

log = logging.getLogger(__name__)


class Migrator:
    def __init__(self, client: Client, layout: Layout = ONE_SERVER) -> None:
        self.client = client
        self.layout = layout

    def run(self) -> list[int]:
        """Brings the schema up to date; the versions of the migrations this run applied."""
        for sql in create_sql(self.layout):
            self.client.command(sql)
        # columns first: a migration's views read the tables as the models are now (a reading made nullable)
        for sql in reconcile_columns_sql(self.layout, self.catalog()):
            log.info("schema: %s", sql)
            self.client.command(sql)
        done = self.applied()
        ran = []
        for m in MIGRATIONS:
            if m.version not in done:
                self._apply(m)
                ran.append(m.version)
        return ran

    def applied(self) -> set[int]:
        rows = self.client.query(f"SELECT version FROM `{BOOKKEEPING}` FINAL").result_rows
        return {int(r[0]) for r in rows}

    def catalog(self) -> Catalog:
        rows = self.client.query("SELECT table, name, type, compression_codec FROM system.columns "
                                 "WHERE database = currentDatabase()").result_rows
        out: dict[str, dict[str, tuple[str, str]]] = {}
        for table, name, typ, codec in rows:
            out.setdefault(table, {})[name] = (typ, codec)
        return out

    def _apply(self, m: Migration) -> None:
        statements = m.statements(self.layout, self.catalog())
        log.info("schema migration %d (%s): %d statements", m.version, m.name, len(statements))
        for sql in statements:
            log.debug("schema migration %d: %s", m.version, sql)
            self.client.command(sql)
        # on a cluster, through the Distributed table and acked once a shard holds it: a restart right after sees it
        settings = {"distributed_foreground_insert": 1} if self.layout.cluster else None
        self.client.insert(BOOKKEEPING, [[m.version, m.name, datetime.now(UTC), len(statements), _who()]],
                           column_names=["version", "name", "applied_at", "statements", "by"], settings=settings)


def _who() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"
