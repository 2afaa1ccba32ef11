"""Idempotent inserts and resume offsets against any ClickHouse (server or embedded endpoint)."""

from __future__ import annotations

import logging
import threading
import time

from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import ClickHouseError

from clocktower.schemas.clickhouse_ddl import ONE_SERVER, Layout
from clocktower.schemas.sql_literal import quote
from clocktower.schemas.topics import TopicSpec
from clocktower.sinks.clickhouse.migrator import Migrator
from clocktower.sinks.clickhouse.partition_batch import PartitionBatch

log = logging.getLogger(__name__)


class TableWriter:
    """Writes partition batches as Arrow columns, each with its dedup token."""

    def __init__(self, client: Client, retries: int = 5, backoff_s: float = 0.2, layout: Layout = ONE_SERVER) -> None:
        """`layout`: one server, or a cluster (inserts then go through the Distributed tables, each acked only once
        its shard has the rows, so a retry's dedup token meets the first try's on that shard)."""
        self.client = client
        self.layout = layout
        self.retries = retries
        self.backoff_s = backoff_s
        # The sink inserts on its own thread and checks resume points on the main one: one request at a time on
        # the client, whose session ClickHouse locks per query (two at once fail with SESSION_IS_LOCKED).
        self._lock = threading.Lock()

    def ensure_schema(self) -> list[int]:
        """Creates, migrates and reconciles the tables (sinks/clickhouse/migrator.py): the migrations it ran."""
        return Migrator(self.client, self.layout).run()

    def insert(self, batch: PartitionBatch) -> None:
        """Insert one batch; retries reuse the token, so a lost reply never doubles rows."""
        table = batch.to_arrow()
        settings = {"insert_deduplication_token": batch.dedup_token()}
        if self.layout.cluster:
            settings["distributed_foreground_insert"] = 1
        for attempt in range(self.retries + 1):
            try:
                with self._lock:
                    self.client.insert_arrow(batch.spec.table, table, settings=settings)
                return
            except (ClickHouseError, OSError) as exc:
                if attempt == self.retries:
                    raise
                log.warning("insert into %s failed (%s); retrying", batch.spec.table, exc)
                time.sleep(self.backoff_s * 2**attempt)

    def resume_offsets(self, spec: TopicSpec) -> dict[tuple[str, int], int]:
        """Per (topic, partition) of `spec`'s topic, the offset after the last record of it stored in the table."""
        rows = self._query(
            f"SELECT _partition, max(_offset) FROM `{spec.table}` WHERE _topic = {{t:String}} AND _offset >= 0 "
            "GROUP BY _partition", {"t": spec.name})
        return {(spec.name, int(p)): int(o) + 1 for p, o in rows}

    def stored_record(self, spec: TopicSpec, partition: int, offset: int) -> tuple[int, int] | None:
        """(rows, min ts_ns) stored from one record, None if none."""
        count, ts = self._query(
            f"SELECT count(), min(ts_ns) FROM `{spec.table}` WHERE _topic = {{t:String}} AND _partition = {{p:UInt32}} "
            "AND _offset = {o:Int64}", {"t": spec.name, "p": partition, "o": offset})[0]
        return (int(count), int(ts)) if count else None

    def dead_lettered(self, topic: str, partition: int, offset: int) -> bool:
        """Whether the deadletter table holds this record."""
        return bool(self._query(
            "SELECT count() FROM deadletter WHERE origin_topic = {t:String} AND origin_partition = {p:UInt32} "
            "AND origin_offset = {o:Int64}", {"t": topic, "p": partition, "o": offset})[0][0])

    def delete_from(self, spec: TopicSpec, partition: int, from_offset: int) -> int:
        """Delete the rows of records at offsets >= `from_offset` (the broker lost them); returns how many went.

        Dead letters are kept: the deadletter table is also the stored copy of the `deadletter` topic, whose
        own resume point and loss check read it. It is a ReplacingMergeTree by origin, so a new dead letter
        for a record now at a reused offset replaces the old one. Synchronous (mutations_sync=2), so the
        sink reads the log again only once the rows are gone.
        """
        return self._delete(spec.table, f"`_topic` = {quote(spec.name)} AND `_partition` = "
                            f"{int(partition)} AND `_offset` >= {int(from_offset)}")

    def _delete(self, table: str, where: str) -> int:
        rows = int(self._query(f"SELECT count() FROM `{table}` WHERE {where}")[0][0])
        if rows:
            with self._lock:
                settings = {"mutations_sync": 2}
                if self.layout.cluster:   # ON CLUSTER waits 180 s by default: a large delete would time out
                    settings["distributed_ddl_task_timeout"] = 3600
                self.client.command(self.delete_sql(table, where), settings=settings)
        return rows

    def delete_sql(self, table: str, where: str) -> str:
        """The mutation deleting `where` from `table`: on a cluster, from every shard's local table (a Distributed
        table cannot be altered)."""
        layout = self.layout
        return f"ALTER TABLE {layout.qualified(layout.storage(table))}{layout.on_cluster} DELETE WHERE {where}"

    def _query(self, sql: str, parameters: dict[str, object] | None = None) -> list:
        with self._lock:
            return list(self.client.query(sql, parameters=parameters).result_rows)
