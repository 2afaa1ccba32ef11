"""The flush policy: which partition batches are due, and the offsets to commit after them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from clocktower.schemas.event import Event
from clocktower.schemas.topics import BY_NAME
from clocktower.sinks.clickhouse.partition_batch import PartitionBatch

Key = tuple[str, int]


@dataclass
class FlushPolicy:
    max_rows: int = 10_000
    max_age_s: float = 1.0


class BatchSet:
    """All open batches, keyed by (topic, partition), each flushed when full or old.

    `offsets` holds, per partition, the next offset to commit once that
    partition's batch is inserted. It also advances over records that produced
    no rows (dead-lettered ones), so they are not read again; such a partition
    keeps an empty batch so that its offset is committed on the same schedule.
    """

    def __init__(self, policy: FlushPolicy | None = None, salt: str = "") -> None:
        self.policy = policy or FlushPolicy()
        self.salt = salt   # part of every new batch's dedup token; the sink renews it after a delete (PartitionBatch)
        self.batches: dict[Key, PartitionBatch] = {}
        self.offsets: dict[Key, int] = {}

    def _batch(self, topic: str, partition: int) -> PartitionBatch:
        key = (topic, partition)
        batch = self.batches.get(key)
        if batch is None:
            batch = self.batches[key] = PartitionBatch(BY_NAME[topic], partition, self.salt)
        return batch

    def add(self, topic: str, partition: int, offset: int, events: list[Event], raw: bytes | None = None,
            node_mac: str = "unchecked") -> None:
        self._batch(topic, partition).add(offset, events, raw, node_mac)
        self.offsets[(topic, partition)] = offset + 1

    def add_columns(self, topic: str, partition: int, offset: int, rows: int, columns: Sequence[Sequence[Any]],
                    raw: bytes, node_mac: str = "unchecked") -> None:
        self._batch(topic, partition).add_columns(offset, rows, columns, raw, node_mac)
        self.offsets[(topic, partition)] = offset + 1

    def skip(self, topic: str, partition: int, offset: int) -> None:
        """Record that `offset` was handled without rows (e.g. dead-lettered)."""
        self._batch(topic, partition)
        self.offsets[(topic, partition)] = offset + 1

    def due_keys(self, caught_up: bool = False) -> list[Key]:
        """Partitions whose batch is full or older than max_age_s; once `caught_up` (a consume brought no record)
        with a full batch's rows waiting over all batches, every partition.

        So the tail of a burst does not wait out `max_age_s`, while a live stream (16 nodes: about 10k events/s)
        still makes about one insert a second per partition, not one per idle moment (with a tenth, 1,000 rows,
        every idle consume of that stream would qualify: up to 3-4 inserts a second per partition, by the idle
        pacer's 0.25 s)."""
        p = self.policy
        if caught_up and sum(b.rows for b in self.batches.values()) >= p.max_rows:
            return list(self.batches)
        return [k for k, b in self.batches.items() if b.rows >= p.max_rows or b.age >= p.max_age_s]

    def due(self) -> bool:
        return bool(self.due_keys())

    def take(self, keys: Iterable[Key] | None = None) -> tuple[list[PartitionBatch], dict[Key, int]]:
        """Hand over the batches of `keys` (default: all) with rows, and the offsets to commit after them."""
        keys = list(self.batches) if keys is None else list(keys)
        batches = [b for k in keys if (b := self.batches.pop(k)).rows]
        offsets = {k: self.offsets.pop(k) for k in keys}
        return batches, offsets
