"""Changelog records sent in batches, and every offset commit waits for them.

Faust sends each table write as a record of its own through its topic layers, and persists the changelog offset
in RocksDB once per record: about 87 µs of a worker's CPU a record, measured (issue 19; a third of a worker's time
before this). The write-back (streams/state_store.py) hands a partition's changes over in one go, so they go out
as aiokafka record batches (`create_batch`/`send_batch`, compressed as the producer is), and the changelog offset
is persisted once, at the batch's end.

Sending is asynchronous, and the write-back runs where no await is possible (a commit sensor, or the end of a
batch), so the sends run as tasks, and the producer's `flush` waits for them first: Faust flushes the producer
before every offset commit and before giving partitions up, so no offset is committed, and no partition handed
over, before the changelog holds the state its records made. A batch the broker refuses raises in that flush:
the commit fails, and the worker stops (its restart reads those records again).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from faust.types import TP

log = logging.getLogger(__name__)


class ChangelogBatches:
    def __init__(self, app: Any) -> None:
        self.app = app
        self.records_sent = 0
        self.batches_sent = 0
        self._inflight: set[asyncio.Task] = set()
        self._flush: Callable[[], Awaitable[None]] | None = None

    def send(self, table: Any, partition: int, records: list[tuple[bytes, bytes | None]]) -> None:
        """Queue `records` (key, value or None to delete) for `table`'s changelog partition."""
        if not records:
            return
        self._wrap_flush()
        task = asyncio.ensure_future(self._send(table, partition, records))
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)

    async def _send(self, table: Any, partition: int, records: list[tuple[bytes, bytes | None]]) -> None:
        producer = self.app.producer._ensure_producer()    # the aiokafka producer Faust started
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

    async def wait(self) -> None:
        """Until every queued record is in its changelog; raises what a failed send raised."""
        while self._inflight:
            await asyncio.gather(*list(self._inflight))

    def _wrap_flush(self) -> None:
        """The producer's flush waits for the changelog batches first (see the module's docstring)."""
        if self._flush is not None:
            return
        producer = self.app.producer
        self._flush = flush = producer.flush

        async def flush_with_changelog() -> None:
            await self.wait()
            await flush()

        producer.flush = flush_with_changelog
