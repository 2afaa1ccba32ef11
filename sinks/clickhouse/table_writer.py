"""Idempotent inserts and resume offsets against any ClickHouse (server or embedded endpoint)."""

from __future__ import annotations

import logging
import time

from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import ClickHouseError

from schemas.clickhouse_ddl import all_ddl
from schemas.topics import TopicSpec
from sinks.clickhouse.partition_batch import PartitionBatch

log = logging.getLogger(__name__)


class TableWriter:
    """Writes partition batches as Arrow columns, each with its dedup token."""

    def __init__(self, client: Client, retries: int = 5, backoff_s: float = 0.2) -> None:
        self.client = client
        self.retries = retries
        self.backoff_s = backoff_s

    def ensure_schema(self) -> None:
        for ddl in all_ddl():
            self.client.command(ddl)

    def insert(self, batch: PartitionBatch) -> None:
        """Insert one batch; retries reuse the token, so a lost reply never doubles rows."""
        table = batch.to_arrow()
        settings = {"insert_deduplication_token": batch.dedup_token()}
        for attempt in range(self.retries + 1):
            try:
                self.client.insert_arrow(batch.spec.table, table, settings=settings)
                return
            except (ClickHouseError, OSError) as exc:
                if attempt == self.retries:
                    raise
                log.warning("insert into %s failed (%s); retrying", batch.spec.table, exc)
                time.sleep(self.backoff_s * 2**attempt)

    def resume_offsets(self, spec: TopicSpec) -> dict[int, int]:
        """Per partition, the offset after the last record stored in the table."""
        rows = self.client.query(
            f"SELECT _partition, max(_offset) FROM `{spec.table}` GROUP BY _partition"
        ).result_rows
        return {int(p): int(o) + 1 for p, o in rows}
