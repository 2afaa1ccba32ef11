"""Changelog records sent in batches, and every offset commit waits for them.

Faust sends each table write as a record of its own through its topic layers, and persists the changelog offset
in RocksDB once per record: about 87 µs of a worker's CPU a record, measured (issue 19; a third of a worker's time
before this). The write-back (streams/state_store.py) hands a partition's changes over in one go, so they go out
as aiokafka record batches (`create_batch`/`send_batch`, compressed as the producer is), and the changelog offset
is persisted once, at the batch's end.

The sends run behind the commit barrier (streams/engine/commit_barrier.py): no offset is committed before the
changelog holds the state its records made.
"""

from __future__ import annotations

import asyncio
from typing import Any

from faust.types import TP

from clocktower.streams.engine.commit_barrier import CommitBarrier


class ChangelogBatches:
    def __init__(self, barrier: CommitBarrier) -> None:
        self.barrier = barrier
        self.records_sent = 0
        self.batches_sent = 0

    def send(self, table: Any, partition: int, records: list[tuple[bytes, bytes | None]]) -> None:
        """Queue `records` (key, value or None to delete) for `table`'s changelog partition."""
        if records:
            self.barrier.spawn(self._send(table, partition, records))

    async def _send(self, table: Any, partition: int, records: list[tuple[bytes, bytes | None]]) -> None:
        producer = self.barrier.app.producer._ensure_producer()    # the aiokafka producer Faust started
        topic = table.changelog_topic.get_topic_name()
        deliveries: list[tuple[asyncio.Future, int]] = []
        batch = producer.create_batch()
        for key, value in records:
            if batch.append(key=key, value=value, timestamp=None) is None:   # full: send it, start the next
                if batch.record_count() == 0:
                    raise ValueError(f"a {topic} record of {len(value or b'')} bytes does not fit in a batch")
                deliveries.append((await producer.send_batch(batch, topic, partition=partition), batch.record_count()))
                batch = producer.create_batch()
                if batch.append(key=key, value=value, timestamp=None) is None:
                    raise ValueError(f"a {topic} record of {len(value or b'')} bytes does not fit in a batch")
        deliveries.append((await producer.send_batch(batch, topic, partition=partition), batch.record_count()))
        last = -1
        for delivery, count in deliveries:
            meta = await delivery
            last = max(last, meta.offset + count - 1)
        table.data.set_persisted_offset(TP(topic, partition), last)
        self.records_sent += len(records)
        self.batches_sent += len(deliveries)
