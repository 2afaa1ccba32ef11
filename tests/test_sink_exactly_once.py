"""The sink's commit logic through the real broker and ClickHouse engine, one failure window at a time."""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import Consumer, TopicPartition

from clocktower.producers.kafka_publisher import KafkaPublisher
from clocktower.schemas.telemetry import LinkState
from clocktower.schemas.topics import BY_NAME
from clocktower.sinks.clickhouse.batch_set import FlushPolicy
from clocktower.sinks.clickhouse.kafka_sink import KafkaClickHouseSink
from clocktower.sinks.clickhouse.partition_batch import PartitionBatch
from clocktower.sinks.clickhouse.table_writer import TableWriter

pytestmark = pytest.mark.e2e
T0 = time.time_ns()  # recent: older rows would fall outside the tables' TTL and be dropped on insert
GROUP = "test-sink"


class Crash(Exception):
    pass


class CrashAfterFirstInsert(TableWriter):
    """Inserts the first batch, then dies before the sink can commit: the worst moment to crash."""

    def insert(self, batch: PartitionBatch) -> None:
        super().insert(batch)
        raise Crash


def _publish(bootstrap: str, records: int, per_record: int) -> None:
    pub = KafkaPublisher(bootstrap)
    for r in range(records):
        pub.publish_batch([LinkState(node=f"node-{r % 3}", ts_ns=T0 + r * 1000 + i, interface="eth0",
                                     kind="ethernet", up=True, carrier_changes=i,
                                     speed_mbps=0, operstate="up", carrier=True)
                           for i in range(per_record)])
    assert pub.flush(30) == 0 and not pub.failed


def _committed(bootstrap: str) -> int:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP})
    try:
        return sum(max(tp.offset, 0) for tp in c.committed([TopicPartition("telemetry.links", 0)], timeout=10))
    finally:
        c.close()


def _run_until_caught_up(sink: KafkaClickHouseSink, bootstrap: str, end: int) -> None:
    stop = threading.Event()
    t = threading.Thread(target=sink.run, args=(stop,))
    t.start()
    try:
        for _ in range(300):
            if _committed(bootstrap) >= end:
                break
            stop.wait(0.1)
    finally:
        stop.set()
        t.join(30)


def _crash_after_first_insert(bootstrap: str, client, instance_id: str) -> None:
    """Run a sink that inserts one 100-row batch and dies before committing it."""
    first = KafkaClickHouseSink(bootstrap, CrashAfterFirstInsert(client), topics=["telemetry.links"],
                                group_id=GROUP, policy=FlushPolicy(max_rows=100, max_age_s=60),
                                instance_id=instance_id)
    with pytest.raises(Crash):
        first.run(threading.Event())


def test_crash_between_insert_and_commit_doubles_nothing(services) -> None:
    s, client = services.settings, services.client
    writer = TableWriter(client)
    writer.ensure_schema()
    _publish(s.bootstrap, records=40, per_record=10)

    _crash_after_first_insert(s.bootstrap, client, instance_id="sink-a")
    stored = client.query("SELECT count() FROM link_states").result_rows[0][0]
    assert stored >= 100 and _committed(s.bootstrap) == 0, "rows are in, the offsets are not"

    # A restarted sink with other batch boundaries (so other dedup tokens): only the stored offsets save us.
    second = KafkaClickHouseSink(s.bootstrap, writer, topics=["telemetry.links"], group_id=GROUP,
                                 policy=FlushPolicy(max_rows=70, max_age_s=0.2), instance_id="sink-a")
    _run_until_caught_up(second, s.bootstrap, end=40)
    assert client.query("SELECT count() FROM link_states").result_rows[0][0] == 400
    assert client.query("SELECT uniqExact(_offset) FROM link_states").result_rows[0][0] == 40
    assert _committed(s.bootstrap) == 40


def test_retried_insert_with_the_same_token_is_stored_once(services) -> None:
    writer = TableWriter(services.client)
    writer.ensure_schema()
    batch = PartitionBatch(BY_NAME["telemetry.links"], 0)
    batch.add(5, [LinkState(node="n", ts_ns=T0 + i, interface="eth0", kind="ethernet", up=True,
                            carrier_changes=i, speed_mbps=0, operstate="up", carrier=True) for i in range(25)])
    writer.insert(batch)
    writer.insert(batch)   # e.g. the first reply was lost and the sink retried
    assert services.client.query("SELECT count() FROM link_states").result_rows[0][0] == 25
    assert writer.resume_offsets(BY_NAME["telemetry.links"]) == {("telemetry.links", 0): 6}


def test_offsets_of_rows_stored_before_a_crash_are_committed_on_restart(services) -> None:
    """All rows were inserted but never committed: the restarted sink must commit them, not re-read them."""
    s, client = services.settings, services.client
    writer = TableWriter(client)
    writer.ensure_schema()
    _publish(s.bootstrap, records=10, per_record=10)
    _crash_after_first_insert(s.bootstrap, client, instance_id="sink-b")
    assert _committed(s.bootstrap) == 0
    second = KafkaClickHouseSink(s.bootstrap, writer, topics=["telemetry.links"], group_id=GROUP,
                                 instance_id="sink-b")
    _run_until_caught_up(second, s.bootstrap, end=10)
    assert _committed(s.bootstrap) == 10
    assert second.rows_inserted == 0
    assert client.query("SELECT count() FROM link_states").result_rows[0][0] == 100
