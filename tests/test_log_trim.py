"""The embedded broker's consumed records are deleted only below what every reader committed, never the record
the sink reads back below its resume point, never the newest seconds, never a topic read outside the groups."""

from __future__ import annotations

import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from clocktower.log_trim import OUTSIDE_READERS, LogTrimmer, trim_points, trimmable
from clocktower.topic_admin import READERS
from tests.standalone_broker import StandaloneBroker


def _row(group: str, topic: str, partition: int, committed: int | None) -> dict:
    return {"group": group, "topic": topic, "partition": partition, "committed": committed}


def test_the_point_is_below_the_slowest_reader_and_not_into_the_kept_seconds() -> None:
    readers = {"t": ("sink", "streams")}
    rows = [_row("sink", "t", 0, 100), _row("streams", "t", 0, 40), _row("sink", "t", 1, 100),
            _row("streams", "t", 1, 100)]
    assert trim_points(rows, readers, {("t", 0): 1000, ("t", 1): 70}) == {("t", 0): 39, ("t", 1): 70}


def test_a_reader_without_a_commit_protects_its_partition() -> None:
    readers = {"t": ("sink", "streams")}
    rows = [_row("sink", "t", 0, 100), _row("streams", "t", 0, None), _row("sink", "t", 1, 100)]
    assert trim_points(rows, readers, {("t", 0): 1000, ("t", 1): 1000}) == {}, "no commit, or no row at all"


def test_nothing_to_delete_gives_no_point() -> None:
    assert trim_points([_row("sink", "t", 0, 1)], {"t": ("sink",)}, {("t", 0): 1000}) == {}
    assert trim_points([_row("sink", "t", 0, 50)], {"t": ("sink",)}, {}) == {}, "no kept-from offset: unknown"


def test_topics_read_outside_the_groups_are_never_trimmed() -> None:
    topics = trimmable()
    assert "analytics.clock" in OUTSIDE_READERS and "control.commands" in OUTSIDE_READERS
    assert not OUTSIDE_READERS & set(topics)
    assert topics["telemetry.flows"] == ("clocktower-sink", "clocktower-streams")
    assert topics["analytics.flow_latency"] == ("clocktower-sink",)
    assert set(topics) | OUTSIDE_READERS >= {t for ts in READERS.values() for t in ts}


def test_a_pass_deletes_what_both_groups_committed_on_the_real_broker(tmp_path: Path) -> None:
    broker = StandaloneBroker(tmp_path / "kafka")
    broker.start()
    try:
        bs = broker.bootstrap
        admin = AdminClient({"bootstrap.servers": bs})
        admin.create_topics([NewTopic("tele", num_partitions=2, replication_factor=1)])["tele"].result(15)
        producer = Producer({"bootstrap.servers": bs})
        for i in range(100):
            producer.produce("tele", value=b"x" * 100, partition=i % 2)
        assert producer.flush(15) == 0

        def commit(group: str, offsets: dict[int, int]) -> None:
            c = Consumer({"bootstrap.servers": bs, "group.id": group, "enable.auto.commit": False})
            c.commit(offsets=[TopicPartition("tele", p, o) for p, o in offsets.items()], asynchronous=False)
            c.close()

        commit("a", {0: 40, 1: 50})
        trimmer = LogTrimmer(bs, interval_s=60, keep_s=0, readers={"a": ("tele",), "b": ("tele",)})
        assert trimmer.trim_once() == 0, "group b never committed: nothing goes"
        commit("b", {0: 30, 1: 50})
        assert trimmer.trim_once() == 29 + 49
        probe = Consumer({"bootstrap.servers": bs, "group.id": "probe"})
        assert [probe.get_watermark_offsets(TopicPartition("tele", p), timeout=10) for p in (0, 1)] == \
            [(29, 50), (49, 50)], "the record below each slowest commit is kept"
        probe.close()
        assert trimmer.trim_once() == 0, "a second pass has nothing new"
        keeper = LogTrimmer(bs, interval_s=60, keep_s=3600, readers={"a": ("tele",), "b": ("tele",)})
        commit("a", {0: 50})
        commit("b", {0: 50})
        assert keeper.trim_once() == 0, "every record is within the kept hour"
    finally:
        broker.stop()


def test_the_thread_stops_promptly(tmp_path: Path) -> None:
    trimmer = LogTrimmer("127.0.0.1:9", interval_s=30, keep_s=0)
    trimmer.start()
    t0 = time.monotonic()
    trimmer.stop()
    assert not trimmer.is_alive() and time.monotonic() - t0 < 2
