"""The sink's resume point: keyed on (topic, partition), and safe when the broker lost acknowledged records."""

from __future__ import annotations

import threading
import time

import confluent_kafka
import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from clocktower.producers.kafka_publisher import KafkaPublisher
from clocktower.schemas.codec import dead_letter, encode_batch
from clocktower.schemas.telemetry import LinkState
from clocktower.schemas.topics import BY_NAME, TopicSpec
from clocktower.sinks.clickhouse import kafka_sink
from clocktower.sinks.clickhouse.batch_set import FlushPolicy
from clocktower.sinks.clickhouse.kafka_sink import KafkaClickHouseSink
from clocktower.sinks.clickhouse.partition_batch import PartitionBatch
from clocktower.sinks.clickhouse.resume import OFFSET_BEGINNING, ResumePoint, find_resume, first_reused_offset
from clocktower.sinks.clickhouse.table_writer import TableWriter

T0 = time.time_ns()
TOPIC = "telemetry.links"
GROUP = "test-resume"


def _links(r: int, n: int = 10) -> list[LinkState]:
    return [LinkState(node=f"node-{r % 3}", ts_ns=T0 + r * 1000 + i, interface="eth0", kind="ethernet", up=True,
                      carrier_changes=i, speed_mbps=0, operstate="up", carrier=True) for i in range(n)]


def _kept_prefix(first_new: int, asked: list[int] | None = None):  # noqa: ANN202 - a probe
    def same(o: int) -> bool:
        if asked is not None:
            asked.append(o)
        return o < first_new
    return same


def test_resume_point_rules() -> None:
    assert OFFSET_BEGINNING == confluent_kafka.OFFSET_BEGINNING
    ok = _kept_prefix(10**9)
    assert find_resume(-1, -1, 0, 50, ok) == ResumePoint(OFFSET_BEGINNING)
    assert find_resume(10, 12, 0, 50, ok) == ResumePoint(12)          # rows stored after the last commit
    assert find_resume(12, -1, 0, 12, ok) == ResumePoint(12)          # caught up
    assert find_resume(3, 3, 8, 20, ok) == ResumePoint(8)             # retention removed 3..7: nothing to compare
    assert find_resume(40, 45, 0, 30, _kept_prefix(22)) == ResumePoint(22, lost=True, resume_was=45,
                                                                     first_different=22)  # past the end


def test_a_log_refilled_past_the_resume_point_is_still_checked() -> None:
    """C1: the broker kept 0..5, new records took 6..11; the log end 12 is past the resume point 10."""
    asked: list[int] = []
    point = find_resume(10, 10, 0, 12, _kept_prefix(6, asked))
    assert point == ResumePoint(6, lost=True, resume_was=10, first_different=6)
    assert asked[0] == 9 and len(asked) <= 1 + 4


def test_an_unanswered_check_is_no_loss() -> None:
    """M1: the record below the resume point could not be fetched: resume there, delete and count nothing."""
    assert find_resume(10, 10, 0, 12, lambda o: None) == ResumePoint(10, unchecked=True)
    assert find_resume(10, 10, 0, 10, lambda o: None) == ResumePoint(10, unchecked=True)


def test_unknown_probes_in_a_search_move_only_the_re_read_down_not_the_loss_count() -> None:
    """M1: only offsets shown to differ (or past the log end) count as lost; unknown ones are read again."""
    unknown_at_7 = lambda o: None if o == 7 else o < 8  # noqa: E731 - first reused offset 8
    point = find_resume(10, 10, 0, 12, unknown_at_7)
    assert point.lost and point.offset <= 8 <= point.first_different and not point.certain
    assert point.first_different == 8 or point.resume_was - point.first_different < 2
    only_9_shown = lambda o: False if o == 9 else None  # noqa: E731
    point = find_resume(10, 10, 0, 12, only_9_shown)
    assert point.lost and point.first_different == 9 and point.resume_was == 10, "one record shown lost, not 10"
    point = find_resume(40, 45, 0, 30, lambda o: None)
    assert point.lost and point.first_different == 30, "the log ends at 30: 30..44 are lost, nothing more is shown"
    ticks = iter(range(100))
    point = find_resume(1000, 1000, 0, 2000, _kept_prefix(613), budget_s=3, clock=lambda: next(ticks))
    assert point.lost and not point.certain and point.offset <= 613 <= point.first_different


def test_first_reused_offset_is_a_binary_search() -> None:
    asked: list[int] = []
    assert first_reused_offset(0, 1000, _kept_prefix(613, asked)) == (613, 613) and len(asked) <= 11
    assert first_reused_offset(5, 9, lambda o: True) == (9, 9)
    assert first_reused_offset(5, 9, lambda o: False) == (5, 5)


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


def _store_then_lose(s, writer: TableWriter, refill: list[int]) -> None:  # noqa: ANN001 - settings
    """Store records 0..9 at offsets 0..9, then the broker "loses" the log, and `refill` is written anew."""
    _publish(s.bootstrap, list(range(10)))
    _run_until(_sink(s.bootstrap, writer), s.bootstrap, 10)
    admin = AdminClient({"bootstrap.servers": s.bootstrap})
    admin.delete_topics([TOPIC])[TOPIC].result(15)
    for _ in range(50):
        try:
            admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result(15)
            break
        except Exception:  # noqa: BLE001 - the deletion may still be in progress
            time.sleep(0.2)
    _publish(s.bootstrap, refill)


def _records_by_offset(client) -> dict[int, list[int]]:  # noqa: ANN001
    """offset -> [record number of each distinct record stored there] (10 rows per record)."""
    rows = client.query(f"SELECT _offset, intDiv(ts_ns - {T0}, 1000) AS r, count() FROM link_states "
                        "GROUP BY _offset, r ORDER BY _offset, r").result_rows
    assert all(n == 10 for _, _, n in rows), f"a record stored more or less than once: {rows}"
    out: dict[int, list[int]] = {}
    for o, r, _ in rows:
        out.setdefault(o, []).append(r)
    return out


def _lost_error(caplog, rows: int) -> bool:  # noqa: ANN001
    return any(r.levelname == "ERROR" and "lost acknowledged records" in r.getMessage()
               and f"Deleted their {rows} rows" in r.getMessage() for r in caplog.records)


@pytest.mark.e2e
def test_a_log_that_lost_acked_records_resumes_at_the_first_reused_offset(services, caplog) -> None:
    s, client = services.settings, services.client
    writer = TableWriter(client)
    writer.ensure_schema()
    # The broker kept records 0..5; new records 100..102 get offsets 6..8 (log end 9 < resume 10).
    _store_then_lose(s, writer, [0, 1, 2, 3, 4, 5, 100, 101, 102])
    _run_until(_sink(s.bootstrap, writer), s.bootstrap, 9)
    assert _records_by_offset(client) == {**{o: [o] for o in range(6)}, 6: [100], 7: [101], 8: [102]}
    assert _committed(s.bootstrap) == 9
    assert _lost_error(caplog, 40), "the ERROR line counts the 40 deleted rows of lost records 6..9"


@pytest.mark.e2e
def test_new_records_past_the_old_resume_point_are_not_skipped(services, caplog) -> None:
    """C1: producers refilled the log to 12, past the resume point 10, before the sink came back."""
    s, client = services.settings, services.client
    writer = TableWriter(client)
    writer.ensure_schema()
    _store_then_lose(s, writer, [0, 1, 2, 3, 4, 5, 100, 101, 102, 103, 104, 105])
    _run_until(_sink(s.bootstrap, writer), s.bootstrap, 12)
    assert _records_by_offset(client) == {**{o: [o] for o in range(6)}, **{6 + i: [100 + i] for i in range(6)}}
    assert _lost_error(caplog, 40)


@pytest.mark.e2e
def test_lost_records_resent_after_newer_ones_are_stored_once(services, caplog) -> None:
    """C2: the ack hold resends lost records 6 and 7 after a newer record took offset 6: each is stored once."""
    s, client = services.settings, services.client
    writer = TableWriter(client)
    writer.ensure_schema()
    _store_then_lose(s, writer, [0, 1, 2, 3, 4, 5, 100, 6, 7])
    _run_until(_sink(s.bootstrap, writer), s.bootstrap, 9)
    stored = _records_by_offset(client)
    assert stored == {**{o: [o] for o in range(6)}, 6: [100], 7: [6], 8: [7]}
    assert _lost_error(caplog, 40)


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


@pytest.mark.e2e
def test_rows_deleted_after_a_loss_can_be_stored_again(services) -> None:
    """ClickHouse remembers dedup tokens past a DELETE: a sink reading kept records again needs a fresh token."""
    client = services.client
    writer = TableWriter(client)
    writer.ensure_schema()
    spec = BY_NAME[TOPIC]
    for salt in ("sink-a", "sink-b"):
        batch = PartitionBatch(spec, 0, salt)
        batch.add(3, _links(3))
        writer.insert(batch)
        assert client.query("SELECT count() FROM link_states").result_rows[0][0] == 10
        assert writer.delete_from(spec, 0, 3) == 10
    first, second = (_sink(services.settings.bootstrap, writer) for _ in range(2))
    assert first.batches.salt != second.batches.salt, "each sink process salts its tokens"


@pytest.mark.e2e
def test_a_broker_that_loses_records_under_a_running_sink_is_not_read_again_from_0(services, tmp_path, caplog) -> None:
    """The fetch position ends up past the log end: with auto.offset.reset=earliest the sink silently read the whole
    log again (doubling it); now the out-of-range fetch goes through the loss path."""
    from tests.standalone_broker import StandaloneBroker
    from tests.test_broker_durability import wait_snapshot

    broker = StandaloneBroker(tmp_path / "kafka")
    broker.start()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result(15)
    writer = TableWriter(services.client)
    writer.ensure_schema()
    stop = threading.Event()
    sink = _sink(broker.bootstrap, writer)
    t = threading.Thread(target=sink.run, args=(stop,))
    try:
        _publish(broker.bootstrap, list(range(10)))
        t.start()
        _wait(lambda: _committed(broker.bootstrap) == 10, "records 0..9 stored")
        _wait_saved(broker, wait_snapshot)
        saved = (broker.data_dir / "kafka.json").read_bytes()     # the state a kill -9 would fall back to
        _publish(broker.bootstrap, list(range(10, 20)))
        _wait(lambda: _committed(broker.bootstrap) == 20, "records 10..19 stored")
        broker.kill9()
        (broker.data_dir / "kafka.json").write_bytes(saved)       # records 10..19 were acked, stored, then lost
        broker.start()
        _publish(broker.bootstrap, [100, 101, 102])               # new records at offsets 10..12
        _wait(lambda: _committed(broker.bootstrap) == 13, "the sink to store new records 10..12 (not 0..12 again)")
        time.sleep(1.0)                                           # and nothing else arrives
    finally:
        stop.set()
        t.join(30)
        broker.kill9()
    assert _records_by_offset(services.client) == {**{o: [o] for o in range(10)}, 10: [100], 11: [101], 12: [102]}
    assert _lost_error(caplog, 100)


def _wait_saved(broker, wait_snapshot, quiet_s: float = 2.5) -> None:  # noqa: ANN001
    """Until the broker's state file holds what it has acknowledged: it writes about once a second while anything
    changed, so either a new file appears, or none for `quiet_s` (the last one, already written, holds it all)."""
    try:
        wait_snapshot(broker, broker.snapshot_id(), timeout=quiet_s)
    except AssertionError:
        assert broker.snapshot_id() is not None, "the broker never wrote its state file"


def _wait(cond, what: str, timeout: float = 30) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


class _FakeConsumer:
    """Hands out prepared lists of messages, as consume() would (pause() stops none: the sink must skip them);
    commits, assignments and paused partitions are recorded only."""

    def __init__(self, polls: list[list[confluent_kafka.Message]], stop: threading.Event) -> None:
        self.polls, self.stop = polls, stop
        self.paused: set[tuple[str, int]] = set()
        self.assigned: list[TopicPartition] = [TopicPartition(TOPIC, 0)]
        self.assigns: list[list[tuple[str, int, int]]] = []
        self.commits: list[list[tuple[str, int, int]]] = []
        self.committed_at: dict[tuple[str, int], int] = {}

    def subscribe(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
        pass

    def consume(self, num_messages: int, timeout: float) -> list[confluent_kafka.Message]:
        if not self.polls:
            self.stop.set()
            return []
        return self.polls.pop(0)

    def assignment(self) -> list[TopicPartition]:
        return list(self.assigned)

    def assign(self, partitions: list[TopicPartition]) -> None:
        self.assigned = [TopicPartition(tp.topic, tp.partition) for tp in partitions]
        self.assigns.append([(tp.topic, tp.partition, tp.offset) for tp in partitions])

    def committed(self, partitions: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, self.committed_at.get((tp.topic, tp.partition), -1001))
                for tp in partitions]

    def commit(self, *args, offsets: list[TopicPartition] | None = None, **kwargs) -> None:  # noqa: ANN002, ANN003
        self.commits.append([(tp.topic, tp.partition, tp.offset) for tp in offsets or []])

    def pause(self, partitions: list[TopicPartition]) -> None:
        self.paused |= {(tp.topic, tp.partition) for tp in partitions}

    def resume(self, partitions: list[TopicPartition]) -> None:
        self.paused -= {(tp.topic, tp.partition) for tp in partitions}

    def close(self) -> None:
        pass

    def unassign(self) -> None:
        self.assigned = []


class _FakeWriter:
    def __init__(self, stored: dict[tuple[str, int], int] | None = None) -> None:
        self.offsets: list[int] = []
        self.by_partition: dict[int, list[int]] = {}
        self.stored = stored or {}

    def insert(self, batch: PartitionBatch) -> None:
        offsets = batch.to_arrow().column("_offset").to_pylist()
        self.offsets += offsets
        self.by_partition.setdefault(batch.partition, []).extend(sorted(set(offsets)))

    def resume_offsets(self, spec: TopicSpec) -> dict[tuple[str, int], int]:
        return dict(self.stored)


def _message(offset: int, error: int | None = None, partition: int = 0) -> confluent_kafka.Message:
    key, value, headers = _record(offset)
    err = confluent_kafka.KafkaError(error, "fake") if error is not None else None
    return confluent_kafka.Message(topic=TOPIC, partition=partition, offset=offset, key=key, value=value,
                                   headers=headers, error=err)


def _answers(sink: KafkaClickHouseSink, answers: dict[int, list[ResumePoint | Exception]],
             asked: list[int] | None = None) -> None:
    """Replace the broker checks: partition -> the points its successive checks give (or raise)."""
    def resume_point(consumer, probe, tp, committed, stored, deadline):  # noqa: ANN001, ANN202
        if asked is not None:
            asked.append(tp.partition)
        answer = answers[tp.partition].pop(0) if len(answers[tp.partition]) > 1 else answers[tp.partition][0]
        if isinstance(answer, Exception):
            raise answer
        return answer, answer.offset + 5
    sink._resume_point = resume_point  # type: ignore[method-assign]


def test_records_after_an_out_of_range_error_in_the_same_poll_are_not_batched_twice() -> None:
    """After the positions are reset, the rest of that poll's list is fetched again: handling it too doubled it."""
    stop = threading.Event()
    writer = _FakeWriter()
    sink = KafkaClickHouseSink("127.0.0.1:9", writer, topics=[TOPIC], group_id=GROUP, instance_id="fake",  # type: ignore[arg-type]
                               policy=FlushPolicy(max_rows=1000, max_age_s=60))
    sink.consumer.close()
    sink.consumer = _FakeConsumer([[_message(0), _message(1, confluent_kafka.KafkaError._AUTO_OFFSET_RESET),
                                    _message(1)], [_message(1)]], stop)  # type: ignore[assignment]
    reassigned: list[int] = []
    _answers(sink, {0: [ResumePoint(1)]}, reassigned)
    sink.run(stop)
    assert reassigned == [0]
    assert sorted(set(writer.offsets)) == [0, 1] and len(writer.offsets) == 20, "each record's 10 rows once"


def _fake_sink(writer: object, polls: list[list[confluent_kafka.Message]] | None = None,
               stop: threading.Event | None = None) -> KafkaClickHouseSink:
    sink = KafkaClickHouseSink("127.0.0.1:9", writer, topics=[TOPIC], group_id=GROUP, instance_id="fake",  # type: ignore[arg-type]
                               policy=FlushPolicy(max_rows=1000, max_age_s=60))
    sink.consumer.close()
    sink.consumer = _FakeConsumer(polls or [], stop or threading.Event())  # type: ignore[assignment]
    return sink


def test_a_failed_check_after_an_out_of_range_fetch_is_retried_and_never_ends_the_sink(monkeypatch) -> None:
    """Minor 6: committed()/watermarks fail right after a broker restart: the sink pauses, retries, goes on."""
    monkeypatch.setattr(kafka_sink, "RECHECK_BACKOFF_S", (0.01, 0.02))
    stop = threading.Event()
    writer = _FakeWriter()
    oor = confluent_kafka.KafkaError._AUTO_OFFSET_RESET
    sink = _fake_sink(writer, [[_message(0), _message(1, oor)], *([[]] * 20), [_message(1)]], stop)
    sink._recheck_backoff = 0.01
    calls: list[bool] = []
    on_assign = sink._on_assign

    def checked_on_assign(consumer, partitions, checked=frozenset()) -> None:  # noqa: ANN001
        calls.append(bool(consumer.paused))
        if len(calls) < 3:
            raise confluent_kafka.KafkaException(confluent_kafka.KafkaError(confluent_kafka.KafkaError._TRANSPORT))
        on_assign(consumer, partitions, checked)

    sink._on_assign = checked_on_assign  # type: ignore[method-assign]
    _answers(sink, {0: [ResumePoint(1)]})
    consume = sink.consumer.consume

    def slow_consume(num_messages: int, timeout: float) -> list[confluent_kafka.Message]:
        time.sleep(0.005)
        return consume(num_messages, timeout)

    sink.consumer.consume = slow_consume  # type: ignore[method-assign]
    sink.run(stop)   # returns only when the fake runs out of polls
    assert calls == [False, True, True], "failed twice while paused, then checked again"
    assert not sink.consumer.paused and sink._recheck_at is None
    assert sorted(set(writer.offsets)) == [0, 1], "record 0 (flushed) and 1 (after the retry) stored"


def _chdb_writer(tmp_path) -> TableWriter:  # noqa: ANN001
    clickhouse_connect = pytest.importorskip("clickhouse_connect")
    writer = TableWriter(clickhouse_connect.get_client(interface="chdb", path=str(tmp_path / "ch")))
    writer.ensure_schema()
    return writer


def _count(writer: TableWriter, table: str = "link_states") -> int:
    return int(writer.client.query(f"SELECT count() FROM {table}").result_rows[0][0])


def _insert_taken(sink: KafkaClickHouseSink, writer: TableWriter) -> None:
    batches, _ = sink.batches.take()
    for batch in batches:
        writer.insert(batch)


def test_one_sink_stores_records_again_after_it_deleted_them(tmp_path) -> None:
    """C1: the same sink deletes rows after a loss and reads the same records again: they are stored again."""
    writer = _chdb_writer(tmp_path)
    sink = _fake_sink(writer)
    for _ in range(2):
        for o in range(3):
            sink.batches.add(TOPIC, 0, o, _links(o), _record(o)[1])
        _insert_taken(sink, writer)
        assert _count(writer) == 30, "records 0..2 stored (again)"
        sink._forget_lost(TopicPartition(TOPIC, 0), ResumePoint(0, lost=True, resume_was=3, first_different=0), 3)
        assert _count(writer) == 0


def _store_dead_letter(writer: TableWriter, offset: int) -> None:
    batch = PartitionBatch(BY_NAME["deadletter"], 0)
    batch.add(offset, [dead_letter(TOPIC, 0, offset, b"k", b"v", "sink error: boom", "sink")])
    writer.insert(batch)


def test_a_record_dead_lettered_by_the_sink_matches_its_dead_letter(tmp_path) -> None:
    """Minor 4: a record that decodes but was dead-lettered (sink error) has no rows: it is the same, not lost."""
    writer = _chdb_writer(tmp_path)
    sink = _fake_sink(writer)
    _store_dead_letter(writer, 4)
    assert sink._matches(_message(4), TOPIC, 0, 4)
    assert not sink._matches(_message(5), TOPIC, 0, 5), "no rows and no dead letter: differs"


def test_deleting_lost_records_keeps_the_deadletter_topic_stored(tmp_path) -> None:
    """The deadletter table is also the stored `deadletter` topic: deleting dead letters of lost records dropped its
    resume point (a false loss and stale dead letters read again). A new dead letter at a reused offset replaces."""
    writer = _chdb_writer(tmp_path)
    for o in (2, 5):
        _store_dead_letter(writer, o)
    writer.delete_from(BY_NAME[TOPIC], 0, 3)
    assert writer.resume_offsets(BY_NAME["deadletter"]) == {("deadletter", 0): 6}
    assert writer.dead_lettered(TOPIC, 0, 2) and writer.dead_lettered(TOPIC, 0, 5)
    batch = PartitionBatch(BY_NAME["deadletter"], 0)
    batch.add(7, [dead_letter(TOPIC, 0, 5, b"k2", b"v2", "sink error: the new record", "sink")])
    writer.insert(batch)
    rows = writer.client.query("SELECT origin_offset, reason FROM deadletter FINAL ORDER BY origin_offset").result_rows
    assert rows == [(2, "sink error: boom"), (5, "sink error: the new record")]


class _SilentBroker:
    """Answers nothing: watermarks and probes take as long as they are allowed."""

    def __init__(self) -> None:
        self.timeouts: list[float] = []

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float) -> tuple[int, int]:
        self.timeouts.append(timeout)
        return 0, 12

    def assign(self, partitions: list[TopicPartition]) -> None:
        pass

    def consume(self, num_messages: int, timeout: float) -> list[confluent_kafka.Message]:
        self.timeouts.append(timeout)
        time.sleep(timeout)
        return []


def test_the_first_check_and_the_watermarks_stay_within_the_search_budget() -> None:
    """Minor 1: the check below the resume point and the watermark look-up are bounded by the deadline."""
    sink = _fake_sink(_FakeWriter())
    broker = _SilentBroker()
    start = time.monotonic()
    point, high = sink._resume_point(broker, broker, TopicPartition(TOPIC, 0), 10, 10, start + 0.3)  # type: ignore[arg-type]
    assert point == ResumePoint(10, unchecked=True) and high == 12
    assert time.monotonic() - start < 0.6 and max(broker.timeouts) <= 0.3
    point, _ = sink._resume_point(broker, broker, TopicPartition(TOPIC, 0), 10, 10, time.monotonic())  # type: ignore[arg-type]
    assert point == ResumePoint(10, unchecked=True), "budget spent: no watermarks, resume unchecked"


def test_a_failed_check_on_assignment_is_retried_not_raised_out_of_the_callback() -> None:
    """An exception in the rebalance callback would end run(): the partitions are checked again later."""
    sink = _fake_sink(_FakeWriter())
    sink.consumer.assigned = []   # inside the rebalance callback nothing is assigned yet
    given: list[int] = []
    _answers(sink, {3: [confluent_kafka.KafkaException(confluent_kafka.KafkaError(
        confluent_kafka.KafkaError._TRANSPORT)), ResumePoint(7)]}, given)
    sink._assigned(sink.consumer, [TopicPartition(TOPIC, 3)])  # type: ignore[arg-type]
    assert sink._recheck_at is not None and sink.consumer.paused == {(TOPIC, 3)}, "assigned, then paused itself"
    sink._check_after_out_of_range()
    assert given == [3, 3], "the partitions of the failed assignment"
    assert sink.consumer.assigns[-1] == [(TOPIC, 3, 7)]
    assert sink._recheck_at is None and not sink.consumer.paused


def test_an_unchecked_partition_is_not_read_until_its_check_answers(monkeypatch) -> None:
    """Items 1 and 3: an earlier check deleted rows from 6 but its commit was lost (committed 10); the probe of 9 is
    unanswered (or the budget is spent): resuming at 10 skipped 6..9. It stays paused, its records are not handled,
    and it is checked again (alone) until the check answers; the checked partition goes on meanwhile."""
    monkeypatch.setattr(kafka_sink, "RECHECK_BACKOFF_S", (60.0, 60.0))
    stop = threading.Event()
    writer = _FakeWriter({(TOPIC, 0): 3, (TOPIC, 1): 6})
    sink = _fake_sink(writer, [[_message(3, partition=0), _message(10, partition=1)]], stop)
    sink._recheck_backoff = 60.0
    sink.consumer.assigned, sink.consumer.committed_at = [], {(TOPIC, 0): 3, (TOPIC, 1): 10}
    asked: list[int] = []
    _answers(sink, {0: [ResumePoint(3)], 1: [ResumePoint(10, unchecked=True), ResumePoint(6)]}, asked)
    sink._assigned(sink.consumer, [TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)])  # type: ignore[arg-type]
    assert sink.consumer.paused == {(TOPIC, 1)} and sink._recheck_at is not None
    assert all(p != 1 for c in sink.consumer.commits for _, p, _ in c), "no unchecked offset is committed"
    sink.run(stop)   # the recheck is not due yet: partition 0 is read, partition 1's record is not handled
    assert writer.by_partition == {0: [3]}
    sink._check_after_out_of_range()
    assert asked == [0, 1, 1], "only the unchecked partition is checked again"
    assert sink.consumer.assigns[-1] == [(TOPIC, 0, 4), (TOPIC, 1, 6)], "read on where it was; from the checked 6"
    assert not sink.consumer.paused and sink._recheck_at is None and not sink._pending


class _FailingWriter(_FakeWriter):
    """Fails every insert of a batch holding `fail_at`."""

    def __init__(self, fail_at: int) -> None:
        super().__init__()
        self.fail_at = fail_at

    def insert(self, batch: PartitionBatch) -> None:
        if self.fail_at in batch.to_arrow().column("_offset").to_pylist():
            raise OSError("insert failed")
        super().insert(batch)


def test_after_a_failed_insert_nothing_later_is_inserted_or_committed_and_a_revoke_or_close_goes_on() -> None:
    """The insert thread: a failed insert stops every later one (rows at later offsets would move the resume point
    past the missing ones), nothing is committed past it, and a revoke or close after it does not raise."""
    writer = _FailingWriter(fail_at=1)
    sink = _fake_sink(writer)
    sink.handle(_message(0))
    sink.flush()
    assert sink.consumer.commits == [[(TOPIC, 0, 1)]] and writer.offsets == [0] * 10
    sink.handle(_message(1))
    with pytest.raises(OSError):
        sink.flush()
    sink.handle(_message(2))
    with pytest.raises(OSError):
        sink.flush()   # the failure stays: record 2 is not inserted behind the missing record 1
    assert writer.offsets == [0] * 10 and sink.consumer.commits == [[(TOPIC, 0, 1)]]
    sink._on_revoke(sink.consumer, [TopicPartition(TOPIC, 0)])   # logged, dropped: read again by the next owner
    assert sink.inserts.pending == 0 and not sink.batches.batches
    writer.fail_at = -1
    sink.handle(_message(1))
    sink.flush()
    assert sink.consumer.commits[-1] == [(TOPIC, 0, 2)] and writer.offsets == [0] * 10 + [1] * 10
    sink.close()


def test_close_stores_what_is_pending_through_the_insert_thread() -> None:
    writer = _FakeWriter()
    sink = _fake_sink(writer)
    revoked: list[bool] = []
    sink.consumer.close = lambda: (revoked.append(True), sink._on_revoke(sink.consumer, []))  # type: ignore[method-assign]
    sink.handle(_message(0))
    sink.close()   # librdkafka's close revokes: the revoke stores before the insert thread stops
    assert revoked and writer.offsets == [0] * 10 and sink.consumer.commits == [[(TOPIC, 0, 1)]]
