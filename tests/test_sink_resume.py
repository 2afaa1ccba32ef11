"""The sink's resume point: keyed on (topic, partition), and safe when the broker lost acknowledged records."""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from producers.kafka_publisher import KafkaPublisher
from schemas.codec import encode_batch
from schemas.telemetry import LinkState
from schemas.topics import BY_NAME, TopicSpec
from sinks.clickhouse.batch_set import FlushPolicy
from sinks.clickhouse.kafka_sink import KafkaClickHouseSink
from sinks.clickhouse.partition_batch import PartitionBatch
from sinks.clickhouse.resume import ResumePoint, first_reused_offset, resume_point
from sinks.clickhouse.table_writer import TableWriter

T0 = time.time_ns()
TOPIC = "telemetry.links"
GROUP = "test-resume"


def _links(r: int, n: int = 10) -> list[LinkState]:
    return [LinkState(node=f"node-{r % 3}", ts_ns=T0 + r * 1000 + i, interface="eth0", kind="ethernet", up=True,
                      carrier_changes=i) for i in range(n)]


def test_resume_point_rules() -> None:
    assert resume_point(-1, -1, 50) == ResumePoint(OFFSET_BEGINNING)
    assert resume_point(10, 12, 50) == ResumePoint(12)          # rows stored after the last commit
    assert resume_point(12, -1, 12) == ResumePoint(12)          # caught up
    assert resume_point(40, 45, 30) == ResumePoint(30, lost=True, lost_count=15)   # past the log end


def test_first_reused_offset_is_a_binary_search() -> None:
    asked: list[int] = []

    def same(o: int) -> bool:
        asked.append(o)
        return o < 613

    assert first_reused_offset(0, 1000, same) == 613 and len(asked) <= 11
    assert first_reused_offset(5, 9, lambda o: True) == 9 and first_reused_offset(5, 9, lambda o: False) == 5


@pytest.mark.e2e
def test_resume_offsets_are_kept_per_topic_even_in_a_shared_table(services) -> None:
    writer = TableWriter(services.client)
    writer.ensure_schema()
    links = BY_NAME[TOPIC]
    other = TopicSpec("site-b.links", LinkState, links.table, 1, links.retention_ms, "another site's links")
    for spec, offset in ((links, 100), (other, 5)):
        batch = PartitionBatch(spec, 0)
        batch.add(offset, _links(offset))
        writer.insert(batch)
    assert writer.resume_offsets(links) == {(TOPIC, 0): 101}
    assert writer.resume_offsets(other) == {("site-b.links", 0): 6}


def _publish(bootstrap: str, records: list[int]) -> None:
    pub = KafkaPublisher(bootstrap)
    for r in records:
        pub.publish_raw(TOPIC, *_record(r))
    assert pub.flush(30) == 0 and not pub.failed


def _record(r: int) -> tuple[bytes, bytes, list]:
    key, value, headers = encode_batch(_links(r))
    return key, value, headers


def _committed(bootstrap: str) -> int:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP})
    try:
        return c.committed([TopicPartition(TOPIC, 0)], timeout=10)[0].offset
    finally:
        c.close()


def _run_until(sink: KafkaClickHouseSink, bootstrap: str, end: int) -> None:
    stop = threading.Event()
    t = threading.Thread(target=sink.run, args=(stop,))
    t.start()
    try:
        for _ in range(300):
            if _committed(bootstrap) == end:
                break
            stop.wait(0.1)
    finally:
        stop.set()
        t.join(30)


def _sink(bootstrap: str, writer: TableWriter) -> KafkaClickHouseSink:
    return KafkaClickHouseSink(bootstrap, writer, topics=[TOPIC], group_id=GROUP, instance_id="resume-a",
                               policy=FlushPolicy(max_rows=1000, max_age_s=0.2))


@pytest.mark.e2e
def test_a_log_that_lost_acked_records_resumes_at_the_first_reused_offset(services, caplog) -> None:
    s, client = services.settings, services.client
    writer = TableWriter(client)
    writer.ensure_schema()
    _publish(s.bootstrap, list(range(10)))             # records 0..9 at offsets 0..9
    _run_until(_sink(s.bootstrap, writer), s.bootstrap, 10)
    assert client.query("SELECT count() FROM link_states").result_rows[0][0] == 100

    # The broker "loses" offsets 6..9: it kept records 0..5, and new records 100..102 get offsets 6..8.
    admin = AdminClient({"bootstrap.servers": s.bootstrap})
    admin.delete_topics([TOPIC])[TOPIC].result(15)
    for _ in range(50):
        try:
            admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result(15)
            break
        except Exception:  # noqa: BLE001 - the deletion may still be in progress
            time.sleep(0.2)
    _publish(s.bootstrap, [0, 1, 2, 3, 4, 5, 100, 101, 102])

    _run_until(_sink(s.bootstrap, writer), s.bootstrap, 9)
    by_offset = dict(client.query("SELECT _offset, count() FROM link_states GROUP BY _offset").result_rows)
    assert {o: n for o, n in by_offset.items() if o >= 0} == {o: 10 for o in range(9)}, "nothing doubled or skipped"
    assert {o: n for o, n in by_offset.items() if o < 0} == {-1 - o: 10 for o in (6, 7, 8, 9)}, "lost rows kept"
    new = client.query("SELECT min(ts_ns) FROM link_states WHERE _offset = 6").result_rows[0][0]
    assert new == T0 + 100 * 1000, "offset 6 now holds the new record"
    assert _committed(s.bootstrap) == 9
    assert any("lost at least 1 acknowledged records" in r.getMessage() and r.levelname == "ERROR"
               for r in caplog.records)


@pytest.mark.e2e
def test_tables_made_before_topic_was_stored_are_migrated(services) -> None:
    """A data dir from before `_topic`: its rows are from the table's one topic, and resume still finds them."""
    client = services.client
    old_ddl = ("CREATE TABLE link_states (node LowCardinality(String), ts_ns Int64, _partition UInt32, "
               "_offset Int64) ENGINE = MergeTree ORDER BY (node, ts_ns)")
    client.command(old_ddl)
    client.command(f"INSERT INTO link_states VALUES ('n', {T0}, 0, 41)")
    writer = TableWriter(client)
    writer.ensure_schema()
    writer.ensure_schema()   # and again: idempotent
    assert writer.resume_offsets(BY_NAME[TOPIC]) == {(TOPIC, 0): 42}
