"""The sink's insert thread: inserts in order, offsets released only after their rows and every earlier job's, a
failure stops every later insert until reset, and at most `depth` jobs wait."""

from __future__ import annotations

import threading

import pytest

from clocktower.schemas.topics import BY_NAME
from clocktower.sinks.clickhouse.insert_queue import InsertQueue
from clocktower.sinks.clickhouse.partition_batch import PartitionBatch

T = "telemetry.links"


def _batch(partition: int) -> PartitionBatch:
    return PartitionBatch(BY_NAME[T], partition)


class Writer:
    def __init__(self, fail_on: set[int] | None = None) -> None:
        self.inserted: list[int] = []
        self.fail_on = fail_on or set()
        self.gate = threading.Event()
        self.gate.set()

    def insert(self, batch: PartitionBatch) -> None:
        self.gate.wait(10)
        if batch.partition in self.fail_on:
            raise OSError("insert failed")
        self.inserted.append(batch.partition)


def test_offsets_are_released_in_order_once_their_rows_are_stored() -> None:
    w = Writer()
    w.gate.clear()
    q = InsertQueue(w.insert, depth=3)
    q.submit([_batch(0)], {(T, 0): 5})
    q.submit([_batch(1), _batch(2)], {(T, 1): 7, (T, 2): 9})
    assert q.finished() == {}, "nothing is released while the first insert waits"
    w.gate.set()
    assert q.finished(wait=True) == {(T, 0): 5, (T, 1): 7, (T, 2): 9}
    assert w.inserted == [0, 1, 2]
    q.submit([], {(T, 3): 1})   # offsets of dead-lettered records only: in order too
    assert q.finished(wait=True) == {(T, 3): 1}
    q.close()


def test_a_failed_insert_stops_every_later_one_until_reset() -> None:
    w = Writer(fail_on={1})
    q = InsertQueue(w.insert, depth=5)
    q.submit([_batch(0)], {(T, 0): 1})
    q.submit([_batch(1)], {(T, 1): 1})
    q.submit([_batch(2)], {(T, 2): 1})
    with pytest.raises(OSError):
        q.finished(wait=True)
    assert w.inserted == [0], "the job after the failed one was skipped, not inserted"
    with pytest.raises(OSError):
        q.finished(wait=True)   # sticky: nothing after the failure is released
    q.reset()
    assert q.pending == 0
    q.submit([_batch(3)], {(T, 3): 4})
    assert q.finished(wait=True) == {(T, 3): 4}
    assert w.inserted == [0, 3]
    q.close()


def test_at_most_depth_jobs_wait() -> None:
    w = Writer()
    w.gate.clear()
    q = InsertQueue(w.insert, depth=2)
    q.submit([_batch(0)], {(T, 0): 1})
    q.submit([_batch(1)], {(T, 1): 1})
    third = threading.Thread(target=q.submit, args=([_batch(2)], {(T, 2): 1}))
    third.start()
    third.join(0.3)
    assert third.is_alive(), "a third job waits for room"
    w.gate.set()
    third.join(10)
    assert not third.is_alive()
    assert q.finished(wait=True) == {(T, 0): 1, (T, 1): 1, (T, 2): 1}
    q.close()

