"""The embedded broker's consumed records are deleted only below what every reader committed, never the record
the sink reads back below its resume point, never the newest seconds, never a topic read outside the groups."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
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
    assert topics["analytics.flow_latency"] == ("clocktower-sink", "clocktower-streams")   # the congestion detector
    assert topics["groundtruth.faults"] == ("clocktower-sink",)
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

        # The kept seconds are the stack's: a pass deletes nothing past the ends it noted keep_s or more ago.
        clock = [1000.0]
        keeper = LogTrimmer(bs, interval_s=60, keep_s=10, readers={"a": ("tele",), "b": ("tele",)},
                            clock=lambda: clock[0])
        assert keeper.trim_once() == 0, "no end noted 10 s ago yet"       # notes the ends (50, 50)
        for i in range(20):
            producer.produce("tele", value=b"y", partition=i % 2)
        assert producer.flush(15) == 0
        commit("a", {0: 60, 1: 60})
        commit("b", {0: 60, 1: 60})
        clock[0] += 5
        assert keeper.trim_once() == 0, "the ends noted 5 s ago are not 10 s old"
        clock[0] += 6
        assert keeper.trim_once() == (50 - 29) + (50 - 49), "up to the ends noted 11 s ago, not the commits"
        clock[0] += 11
        assert keeper.trim_once() == 2 * (59 - 50), "then up to the commits (less the record below)"

        # The spool's read-back from a deleted offset reads from the log's start and says where that is.
        from clocktower.producers.lost_acks import read_rids
        reader = Consumer({"bootstrap.servers": bs, "group.id": "readback", "enable.partition.eof": True})
        deleted_below: dict = {}
        found = read_rids(reader, {("tele", 0): 10}, "ct-rid", 1000, deleted_below=deleted_below)
        reader.close()
        assert deleted_below == {("tele", 0): 59} and sorted(found[("tele", 0)]) == list(range(59, 60))

        # Records deleted between the read-back's bounds and its fetch: it goes on from the log's new start (the
        # spool's consumer resets to the earliest) and notes it, so none of them is judged lost.
        for i in range(10):
            producer.produce("tele", value=b"z", partition=1, headers=[("ct-rid", b"rid%d" % i)])
        assert producer.flush(15) == 0                                    # partition 1: offsets 60-69

        class DeletesOnAssign(Consumer):
            def assign(self, parts: list) -> None:  # noqa: ANN401 - confluent_kafka's signature
                admin.delete_records([TopicPartition("tele", 1, 65)])[TopicPartition("tele", 1, 65)].result(15)
                super().assign(parts)

        racer = DeletesOnAssign({"bootstrap.servers": bs, "group.id": "readback2", "enable.partition.eof": True,
                                 "auto.offset.reset": "earliest"})
        deleted_below = {}
        found = read_rids(racer, {("tele", 1): 60}, "ct-rid", 1000, deleted_below=deleted_below)
        racer.close()
        assert deleted_below == {("tele", 1): 65}
        assert sorted(found[("tele", 1)]) == list(range(65, 70)) and found[("tele", 1)][69] == b"rid9"
    finally:
        broker.stop()


def test_the_thread_stops_promptly(tmp_path: Path) -> None:
    trimmer = LogTrimmer("127.0.0.1:9", interval_s=30, keep_s=0)
    trimmer.start()
    t0 = time.monotonic()
    trimmer.stop()
    assert not trimmer.is_alive() and time.monotonic() - t0 < 2


@pytest.mark.e2e
def test_the_pipeline_stores_every_event_while_its_consumed_records_are_deleted(tmp_path: Path) -> None:
    """The real broker, streams and sink with a pass every second and 1 s kept: consumed records go, and every
    table still gets exactly what was produced, before and after the deletes."""
    from clocktower.drain import wait_drained
    from clocktower.producers.kafka_publisher import KafkaPublisher
    from clocktower.producers.simulator import FleetSimulator, SimConfig, run_simulation
    from clocktower.schemas.topics import BY_SCHEMA
    from clocktower.summary import table_rows
    from tests.conftest import start_pipeline

    p = start_pipeline(tmp_path / "ct", log_trim_s=1.0, log_keep_s=1.0)
    try:
        s, trimmer = p.settings, p.stack.trimmer
        assert trimmer is not None and trimmer.is_alive()
        publisher = KafkaPublisher(s.bootstrap)
        produced: dict[str, int] = {}
        for seed in (1, 2):
            sim = FleetSimulator(SimConfig(nodes=2, duration_s=5, seed=seed, faults=False),
                                 start_ns=time.time_ns() - 10 * 10**9)
            for schema, n in run_simulation(sim, publisher, 5, realtime=False).items():
                produced[schema] = produced.get(schema, 0) + n
            assert publisher.flush(30) == 0 and not publisher.failed
            assert wait_drained(s.bootstrap, 120, check=p.stack.supervise), "pipeline did not drain"
            deadline = time.monotonic() + 30
            while trimmer.deleted == 0 and time.monotonic() < deadline:
                time.sleep(0.2)
            assert trimmer.deleted > 0, "nothing was deleted"
            rows = table_rows(p.client)
            for schema, n in produced.items():
                assert rows[BY_SCHEMA[schema].table] == n, f"{schema}: produced {n}, stored {rows}"
            assert rows["flow_latency"] == produced["flow_sample"] // 2
        probe = Consumer({"bootstrap.servers": s.bootstrap, "group.id": "probe"})
        lows = [probe.get_watermark_offsets(TopicPartition("telemetry.flows", n), timeout=10)[0] for n in range(6)]
        probe.close()
        assert sum(lows) > 0, lows
    finally:
        p.stack.stop()
