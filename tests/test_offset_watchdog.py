"""The commit-stall check's inputs come from aiokafka and the broker (streams/engine/offset_watchdog.py), not Faust.

The stall of issue 17, rebuilt with a real aiokafka consumer and the embedded broker: a partition read to its end
and never committed. Faust's own bookkeeping showed nothing (its read offset was None); the position and the
broker's commit show it, and the pure check (streams/commit_stall.py) then ends the worker.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import OffsetAndMetadata, TopicPartition
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from clocktower.streams.commit_stall import CommitStall
from clocktower.streams.engine.offset_watchdog import positions_and_commits
from tests.standalone_broker import StandaloneBroker, running

pytestmark = pytest.mark.e2e
TOPIC, OTHER = "watchdog-input", "watchdog-changelog"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneBroker]:
    with running(tmp_path_factory.mktemp("watchdog") / "kafka") as b:
        yield b


def test_a_partition_read_to_its_end_and_never_committed_is_seen_and_ends_the_worker(broker: StandaloneBroker,
                                                                                      tmp_path: Path) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for f in admin.create_topics([NewTopic(TOPIC, 1, 1), NewTopic(OTHER, 1, 1)]).values():
        f.result(10)
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(78):
        producer.produce(TOPIC, value=b"%d" % i)
        producer.produce(OTHER, value=b"%d" % i)
    assert producer.flush(10) == 0
    tp = TopicPartition(TOPIC, 0)

    async def run() -> list[dict]:
        consumer = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap, group_id="watchdog-test",
                                    enable_auto_commit=False, auto_offset_reset="earliest", session_timeout_ms=10_000)
        await consumer.start()
        try:
            consumer.assign([tp, TopicPartition(OTHER, 0)])
            seen = []
            read = 0
            while read < 78:
                read += len((await consumer.getmany(tp, timeout_ms=1000)).get(tp, []))
            acked = lambda topic: topic == TOPIC   # noqa: E731 - Faust acks its agents' topics, not changelogs
            seen.append(await positions_and_commits(consumer, acked))      # read to the end, never committed
            await consumer.commit({tp: OffsetAndMetadata(40, "")})
            seen.append(await positions_and_commits(consumer, acked))      # committed part of the way
            await consumer.commit({tp: OffsetAndMetadata(78, "")})
            seen.append(await positions_and_commits(consumer, acked))      # all committed
            return seen
        finally:
            await consumer.stop()

    never, part, done = asyncio.run(run())
    assert never == {tp: (78, 0)} and part == {tp: (78, 40)} and done == {tp: (78, 78)}
    check = CommitStall(stall_checks=3)
    fed = {t: (pos, committed, None) for t, (pos, committed) in never.items()}   # read, nothing processed
    assert [check.check(fed) for _ in range(3)] == [[], [], [tp]]
    caught_up = {t: (pos, committed, 77) for t, (pos, committed) in done.items()}
    assert all(CommitStall(stall_checks=1).check(caught_up) == [] for _ in range(3))
