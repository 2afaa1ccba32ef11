"""The flush policy: which partition batches are due, and the offsets to commit."""

from __future__ import annotations

import time
from dataclasses import dataclass

from schemas.event import Event
from schemas.topics import BY_NAME
from sinks.clickhouse.partition_batch import PartitionBatch


@dataclass
class FlushPolicy:
    max_rows: int = 10_000
    max_age_s: float = 1.0


class BatchSet:
    """All open batches, keyed by (topic, partition).

    `offsets` holds, per partition, the next offset to commit once every batch
    has been flushed. It also advances over records that produced no rows
    (dead-lettered ones), so they are not read again.
    """

    def __init__(self, policy: FlushPolicy | None = None) -> None:
        self.policy = policy or FlushPolicy()
        self.batches: dict[tuple[str, int], PartitionBatch] = {}
        self.offsets: dict[tuple[str, int], int] = {}
        self._started = time.monotonic()

    def add(self, topic: str, partition: int, offset: int, events: list[Event]) -> None:
        key = (topic, partition)
        batch = self.batches.get(key)
        if batch is None:
            batch = self.batches[key] = PartitionBatch(BY_NAME[topic], partition)
        batch.add(offset, events)
        self.offsets[key] = offset + 1

    def skip(self, topic: str, partition: int, offset: int) -> None:
        """Record that `offset` was handled without rows (e.g. dead-lettered)."""
        self.offsets[(topic, partition)] = offset + 1

    @property
    def rows(self) -> int:
        return sum(b.rows for b in self.batches.values())

    def due(self) -> bool:
        """True when any batch is full or the oldest pending work is older than max_age_s."""
        if any(b.rows >= self.policy.max_rows for b in self.batches.values()):
            return True
        if not self.offsets:
            return False
        oldest = min((b.created for b in self.batches.values()), default=self._started)
        return time.monotonic() - oldest >= self.policy.max_age_s

    def take(self) -> tuple[list[PartitionBatch], dict[tuple[str, int], int]]:
        """Hand over every batch and the offsets to commit after they are inserted."""
        batches, offsets = list(self.batches.values()), dict(self.offsets)
        self.batches.clear()
        self.offsets.clear()
        self._started = time.monotonic()
        return batches, offsets

    def drop(self, keys: set[tuple[str, int]]) -> None:
        """Forget revoked partitions; their next owner re-reads them from the stored offset."""
        for key in keys:
            self.batches.pop(key, None)
            self.offsets.pop(key, None)
