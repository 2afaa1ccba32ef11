"""Changelog records in batches (streams/engine/changelog_batches.py), against the embedded broker with aiokafka's
real producer: every record lands in order in its partition, the changelog offset is persisted once at the end, the
producer's flush (what Faust awaits before each commit) returns only once they are all in, and a batch that cannot
be sent makes that flush raise, so no commit follows."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from confluent_kafka import Consumer, TopicPartition

from clocktower.streams.detectors.gpu_fault import GpuFaultDetector
from clocktower.streams.engine.changelog_batches import ChangelogBatches
from clocktower.streams.engine.commit_barrier import CommitBarrier
from clocktower.streams.registry import changelog_topic
from clocktower.topic_admin import ensure_topics
from tests.standalone_broker import StandaloneBroker, running

TOPIC = changelog_topic(GpuFaultDetector)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[StandaloneBroker]:
    with running(tmp_path / "kafka") as b:
        ensure_topics(b.bootstrap, disable_auto_create=True)
        yield b


class _FaustProducer:
    """What ChangelogBatches uses of Faust's producer service: the aiokafka producer it started, and its flush."""

    def __init__(self, producer: AIOKafkaProducer) -> None:
        self.producer = producer

    def _ensure_producer(self) -> AIOKafkaProducer:
        return self.producer

    async def flush(self) -> None:
        await self.producer.flush()


class _Table:
    def __init__(self, topic: str) -> None:
        self.persisted: dict[tuple[str, int], int] = {}
        self.changelog_topic = type("T", (), {"get_topic_name": lambda _self: topic})()
        self.data = self

    def set_persisted_offset(self, tp: Any, offset: int) -> None:
        self.persisted[(tp.topic, tp.partition)] = offset


def _read(bootstrap: str, topic: str, partition: int, n: int) -> list[tuple[bytes, bytes | None]]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "changelog-test", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, partition, 0)])
    out: list[tuple[bytes, bytes | None]] = []
    try:
        while len(out) < n:
            batch = c.consume(1000, timeout=10)
            assert batch, f"only {len(out)} of {n} records came back"
            out += [(m.key(), m.value()) for m in batch if m.error() is None]
    finally:
        c.close()
    return out


def _high_watermark(bootstrap: str, topic: str, partition: int) -> int:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "changelog-test"})
    try:
        return c.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)[1]
    finally:
        c.close()


async def _send_and_flush(bootstrap: str, table: _Table, partition: int, records: list[tuple[bytes, bytes | None]],
                          pause_s: float = 0.0) -> tuple[ChangelogBatches, int]:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, compression_type="lz4", acks=-1)
    await producer.start()
    try:
        app = type("App", (), {"producer": _FaustProducer(producer)})()
        batches = ChangelogBatches(CommitBarrier(app))
        batches.send(table, partition, records)
        await asyncio.sleep(pause_s)      # the sends may end (or fail) before any commit comes
        await app.producer.flush()        # Faust's flush before a commit: wrapped to wait for the batches
        return batches, _high_watermark(bootstrap, TOPIC, partition)
    finally:
        await producer.stop()


def test_records_land_in_order_and_the_flush_waits_for_them(broker: StandaloneBroker) -> None:
    records = [(f"key-{i % 700}".encode(), None if i % 5 == 0 else bytes(200) + str(i).encode()) for i in range(5000)]
    table = _Table(TOPIC)
    batches, high = asyncio.run(_send_and_flush(broker.bootstrap, table, 1, records))
    assert high == 5000, "the flush returned before every changelog record was in"
    assert batches.records_sent == 5000 and batches.batches_sent > 1
    assert table.persisted == {(TOPIC, 1): 4999}
    assert _read(broker.bootstrap, TOPIC, 1, 5000) == records
    assert _high_watermark(broker.bootstrap, TOPIC, 0) == 0


@pytest.mark.parametrize("pause_s", [0.0, 1.0])
def test_a_batch_that_cannot_be_sent_fails_the_flush(broker: StandaloneBroker, pause_s: float) -> None:
    """No such partition: the send fails, and so does the flush a commit would wait on, also when the send had
    failed before the flush came (a failed send is not forgotten)."""
    table = _Table(TOPIC)
    with pytest.raises(AssertionError, match="Unrecognized partition"):   # aiokafka's check of the partition
        asyncio.run(_send_and_flush(broker.bootstrap, table, 999, [(b"k", b"v")], pause_s))
    assert table.persisted == {}
