"""Idle consumers back off on empty fetches: the embedded broker answers every fetch at once.

Counted against the real broker: librdkafka's own statistics (`brokers.*.req.Fetch`) for the sink, the
fetch requests aiokafka sends for the stream worker. Without the backoff an idle consumer sends thousands
of fetches a second.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiokafka
import aiokafka.consumer.consumer as aiokafka_consumer
import pytest
from aiokafka.consumer.fetcher import Fetcher
from aiokafka.structs import TopicPartition
from confluent_kafka import Consumer

from clocktower.generated_secrets import ensure_control_keys
from clocktower.sinks.clickhouse import kafka_sink
from clocktower.sinks.clickhouse.table_writer import TableWriter
from clocktower.streams.engine import idle_fetch
from tests.conftest import Pipeline

WINDOW_S = 2.0
MAX_FETCHES_PER_S = 200     # paced: a few rounds a second of a few fetches each; unpaced: thousands


class _FetchCount:
    def __init__(self) -> None:
        self.fetches = 0

    def stats(self, raw: str) -> None:
        brokers = json.loads(raw)["brokers"].values()
        self.fetches = sum(b.get("req", {}).get("Fetch", 0) for b in brokers if b.get("nodeid", -1) >= 0)


@pytest.fixture
def sink_fetches(monkeypatch) -> Iterator[_FetchCount]:  # noqa: ANN001
    """Every sink consumer built from now on reports its fetch count here."""
    count = _FetchCount()

    def counting_consumer(config: dict) -> Consumer:
        if config.get("group.id") == "clocktower-sink":
            config = {**config, "statistics.interval.ms": 100, "stats_cb": count.stats}
        return Consumer(config)

    monkeypatch.setattr(kafka_sink, "Consumer", counting_consumer)
    yield count


def test_an_idle_sink_pauses_between_fetches(services: Pipeline, sink_fetches: _FetchCount) -> None:
    writer = TableWriter(services.client)
    writer.ensure_schema()
    sink = kafka_sink.KafkaClickHouseSink(services.settings.bootstrap, writer, instance_id="idle-test")
    stop = threading.Event()
    worker = threading.Thread(target=sink.run, args=(stop,), daemon=True)
    worker.start()
    try:
        deadline = time.monotonic() + 60
        while not sink._next and time.monotonic() < deadline:   # until the partitions are assigned
            time.sleep(0.1)
        assert sink._next, "the sink got no partitions"
        time.sleep(1.0)
        start, before = time.monotonic(), sink_fetches.fetches
        time.sleep(WINDOW_S)
        rate = (sink_fetches.fetches - before) / (time.monotonic() - start)
    finally:
        stop.set()
        worker.join(30)
    assert 0 < rate < MAX_FETCHES_PER_S, f"an idle sink sent {rate:.0f} fetches/s"


async def _idle_fetch_rate(bootstrap: str, topic: str) -> float:
    """Fetch requests per second an idle aiokafka consumer sends, over WINDOW_S once assigned."""
    consumer = aiokafka.AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=f"idle-{time.time_ns()}",
                                         auto_offset_reset="latest", enable_auto_commit=False)
    await consumer.start()
    try:
        deadline = time.monotonic() + 30
        while not consumer.assignment() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert consumer.assignment(), "no partitions assigned"
        await consumer.getmany(timeout_ms=500)
        start, before = time.monotonic(), _requests.count
        await consumer.getmany(timeout_ms=int(WINDOW_S * 1000))
        return (_requests.count - before) / (time.monotonic() - start)
    finally:
        await consumer.stop()


class _Requests:
    count = 0


_requests = _Requests()


@pytest.fixture
def counted_fetches(monkeypatch) -> None:  # noqa: ANN001
    """Count the fetch requests aiokafka sends (IdleBackoffFetcher calls this through super())."""
    proc = Fetcher._proc_fetch_request

    async def counting(self, assignment, node_id, request):  # noqa: ANN001, ANN202
        _requests.count += 1
        return await proc(self, assignment, node_id, request)

    monkeypatch.setattr(Fetcher, "_proc_fetch_request", counting)
    monkeypatch.setattr(aiokafka_consumer, "Fetcher", aiokafka_consumer.Fetcher)   # restored after install()
    monkeypatch.setattr(idle_fetch.IdleBackoffFetcher, "idle_backoff_s", idle_fetch.IdleBackoffFetcher.idle_backoff_s)


def test_an_idle_stream_consumer_backs_off_after_empty_fetches(services: Pipeline, counted_fetches: None) -> None:
    bootstrap = services.settings.bootstrap
    unpaced = asyncio.run(_idle_fetch_rate(bootstrap, "telemetry.flows"))
    idle_fetch.install()
    paced = asyncio.run(_idle_fetch_rate(bootstrap, "telemetry.flows"))
    assert paced < MAX_FETCHES_PER_S and paced * 5 < unpaced, f"fetches/s: {paced:.0f} paced, {unpaced:.0f} not"


def test_the_stream_worker_installs_the_backoff(tmp_path: Path) -> None:
    """The Faust app's consumers are aiokafka consumers: building the app installs the fetcher."""
    tmp_path.chmod(0o700)
    ensure_control_keys(tmp_path)
    env = {**os.environ, "CLOCKTOWER_DATA_DIR": str(tmp_path),
           "CLOCKTOWER_CONTROL_PRIVATE_KEY_FILE": str(tmp_path / "control.key"),
           "CLOCKTOWER_STREAMS_IDLE_FETCH_BACKOFF_MS": "300"}
    code = ("import clocktower.streams.app as a, aiokafka.consumer.consumer as c\n"
            "from clocktower.streams.settings import StreamsSettings\n"
            "a.command_partitions = lambda *args, **kw: 4   # the broker's answer, without a broker\n"
            "a.build_app(StreamsSettings()); print(c.Fetcher.__name__, c.Fetcher.idle_backoff_s)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["IdleBackoffFetcher", "0.3"]


# A busy partition next to an idle one on the same (single) node: aiokafka fetches the idle one alone while the busy
# one's records are buffered past its prefetch_backoff (0.1 s), and that empty fetch must not hold the busy one's next.
BUSY_ROUNDS = 3
RECORDS_PER_ROUND = 3
PROCESS_S = 0.3          # per record: longer than aiokafka's prefetch_backoff, so the idle partition is fetched alone
STALL_BACKOFF_S = 600.0  # a back-off that held the busy partition would outlast the test's timeout by far
BUSY_TIMEOUT_S = 30.0


@dataclass
class _FetchLog:
    """Each fetch request aiokafka sent: its partitions, and which partitions were still buffered then."""

    requests: list[tuple[frozenset[TopicPartition], frozenset[TopicPartition]]] = field(default_factory=list)


@pytest.fixture
def fetch_log(monkeypatch) -> _FetchLog:  # noqa: ANN001
    log = _FetchLog()
    proc = Fetcher._proc_fetch_request

    async def logging(self, assignment, node_id, request):  # noqa: ANN001, ANN202
        sent = frozenset(TopicPartition(topic, p) for topic, parts in request.topics for p, *_ in parts)
        log.requests.append((sent, frozenset(self._records)))
        return await proc(self, assignment, node_id, request)

    monkeypatch.setattr(Fetcher, "_proc_fetch_request", logging)
    monkeypatch.setattr(aiokafka_consumer, "Fetcher", idle_fetch.IdleBackoffFetcher)
    monkeypatch.setattr(idle_fetch.IdleBackoffFetcher, "idle_backoff_s", STALL_BACKOFF_S)
    return log


async def _produce_round(producer: aiokafka.AIOKafkaProducer, busy: TopicPartition) -> int:
    sent = [await producer.send(busy.topic, b"busy", partition=busy.partition) for _ in range(RECORDS_PER_ROUND)]
    await producer.flush()
    return (await sent[0]).offset


async def _consume_busy_next_to_idle(bootstrap: str, topic: str) -> int:
    """Consume BUSY_ROUNDS rounds from partition 0, slowly, while partition 1 stays idle; the next round is
    produced while the current one is still buffered, so every fetch of partition 0 finds records at once."""
    busy, idle = TopicPartition(topic, 0), TopicPartition(topic, 1)
    producer = aiokafka.AIOKafkaProducer(bootstrap_servers=bootstrap)
    consumer = aiokafka.AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await producer.start()
    await consumer.start()
    try:
        first = await _produce_round(producer, busy)
        consumer.assign([busy, idle])
        consumer.seek(busy, first)
        await consumer.seek_to_end(idle)
        consumed = 0
        for round_no in range(BUSY_ROUNDS):
            got = 0
            while got < RECORDS_PER_ROUND:
                records = (await consumer.getmany(busy, timeout_ms=1000, max_records=1)).get(busy, [])
                if records and got == 0 and round_no + 1 < BUSY_ROUNDS:
                    await _produce_round(producer, busy)
                got += len(records)
                await asyncio.sleep(PROCESS_S)   # the worker's processing
            consumed += got
        return consumed
    finally:
        await consumer.stop()
        await producer.stop()


def test_an_idle_partition_does_not_stall_a_busy_one(services: Pipeline, fetch_log: _FetchLog) -> None:
    """Without the early end, the busy partition's next fetch waits out the idle fetch's back-off (600 s here)."""
    topic = "telemetry.clock"   # 2 partitions
    run = _consume_busy_next_to_idle(services.settings.bootstrap, topic)
    consumed = asyncio.run(asyncio.wait_for(run, BUSY_TIMEOUT_S))
    assert consumed == BUSY_ROUNDS * RECORDS_PER_ROUND
    busy, idle = TopicPartition(topic, 0), TopicPartition(topic, 1)
    idle_alone = [sent for sent, buffered in fetch_log.requests if sent == {idle} and busy in buffered]
    assert idle_alone, f"the idle partition was never fetched alone: {fetch_log.requests}"
    # Backed off, not spinning: a few fetches per round (an unpaced consumer sends hundreds meanwhile).
    assert len(fetch_log.requests) <= 10 * BUSY_ROUNDS, f"{len(fetch_log.requests)} fetches"


def test_a_partition_awaiting_an_offset_reset_does_not_end_the_back_off() -> None:
    """aiokafka fetches no partition without a valid position: it must not count as waiting for a fetch, or a
    node whose partition keeps failing its reset would spin at once again. Checked on the real fetcher."""

    async def check() -> list[bool]:
        client = aiokafka.AIOKafkaClient(bootstrap_servers="127.0.0.1:9")
        subs = aiokafka.consumer.subscription_state.SubscriptionState()
        idle, reset = TopicPartition("telemetry.flows", 0), TopicPartition("telemetry.flows", 1)
        subs.assign_from_user({idle, reset})
        fetcher = idle_fetch.IdleBackoffFetcher(client, subs)
        try:
            fetcher._select_read_replica = lambda tp: 0     # both led by node 0 (no metadata without a broker)
            assignment = subs.subscription.assignment
            assignment.state_value(idle).seek(10)
            answers = [fetcher._others_wait(assignment, 0, frozenset({idle}))]   # `reset` has no position yet
            assignment.state_value(reset).seek(3)                                # reset done: now it is fetched
            answers.append(fetcher._others_wait(assignment, 0, frozenset({idle})))
            return answers
        finally:
            await fetcher.close()
            await client.close()

    assert asyncio.run(check()) == [False, True]


def test_an_idle_clock_broadcast_does_not_fetch_and_still_reads_new_estimates(services: Pipeline) -> None:
    """Before: the stream worker's clock broadcast kept its partitions assigned, so librdkafka's broker thread
    fetched non-stop (about half a core in the worker and 40 % in the broker, benchmarks/idle_cpu.py: an idle
    stack at ~108 % of a core). Now it assigns only when a watermark moved."""
    from confluent_kafka import Producer

    from clocktower.schemas.analytics import ClockEstimate
    from clocktower.schemas.codec import encode_batch
    from clocktower.streams.clock_broadcast import TOPIC, ClockBroadcast

    count = _FetchCount()
    broadcast = ClockBroadcast(services.settings.bootstrap, {"statistics.interval.ms": 100, "stats_cb": count.stats})
    producer = Producer({"bootstrap.servers": services.settings.bootstrap})
    now = time.time_ns()

    def estimate(node: str, offset_ns: int) -> None:
        event = ClockEstimate(node=node, ts_ns=now, reference="n0", offset_ns=offset_ns, drift_ppb=0.0,
                              error_bound_ns=10)
        key, value, headers = encode_batch([event])
        producer.produce(TOPIC, key=key, value=value, headers=headers)
        assert producer.flush(10) == 0

    estimate("n1", 1000)                                   # a backlog from before the worker started
    broadcast.start()
    try:
        deadline = time.monotonic() + 20
        while broadcast.estimates < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert broadcast.estimates == 1, "the backlog was not read"
        time.sleep(1.0)
        start, before = time.monotonic(), count.fetches
        time.sleep(WINDOW_S)
        rate = (count.fetches - before) / (time.monotonic() - start)
        assert rate < MAX_FETCHES_PER_S, f"an idle clock broadcast sent {rate:.0f} fetches/s"
        sent = time.monotonic()
        estimate("n2", 2000)
        while broadcast.estimates < 2 and time.monotonic() - sent < 5:
            time.sleep(0.01)
        assert broadcast.estimates == 2, "a new estimate was not read within 5 s"
        assert broadcast.errors == 0
    finally:
        broadcast.stop()


def test_only_the_embedded_broker_gets_the_stream_workers_backoff(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A Kafka broker holds an empty fetch until a record comes, so against one the worker waits for nothing (the
    default profile, `kafka`); `up` and `demo` set the `embedded` profile for their workers: 250 ms, unless the
    backoff itself is set."""
    from clocktower.config import Settings
    from clocktower.stack import Stack
    from clocktower.streams.settings import StreamsSettings

    for var in ("CLOCKTOWER_STREAMS_IDLE_FETCH_BACKOFF_MS", "CLOCKTOWER_KAFKA_BOOTSTRAP", "CLOCKTOWER_BROKER_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    assert StreamsSettings().idle_fetch_backoff_s == 0
    embedded = Stack(Settings(data_dir=tmp_path / "a"))
    assert embedded.env["CLOCKTOWER_BROKER_PROFILE"] == "embedded"
    monkeypatch.setenv("CLOCKTOWER_BROKER_PROFILE", "embedded")
    assert StreamsSettings().idle_fetch_backoff_s == 0.25
    monkeypatch.setenv("CLOCKTOWER_STREAMS_IDLE_FETCH_BACKOFF_MS", "20")
    assert StreamsSettings().idle_fetch_backoff_s == 0.02                              # theirs
    monkeypatch.delenv("CLOCKTOWER_BROKER_PROFILE")
    external = Stack(Settings(data_dir=tmp_path / "b", kafka_bootstrap="kafka.example:9092"))
    assert "CLOCKTOWER_BROKER_PROFILE" not in external.env
