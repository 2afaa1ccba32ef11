"""The actuator's consumer against the real embedded broker: it reads only its node's partition of control.commands,
acks only its own commands (skipping those of a node sharing the partition), refuses a malformed record by the id it
names, dead-letters one naming none, commits after the acks are handed over, and does not handle them again after a
restart."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from clocktower.actuators.actuator import Actuator
from clocktower.actuators.command_consumer import CommandConsumer
from clocktower.actuators.hooks import Hooks
from clocktower.actuators.quarantine import Quarantine
from clocktower.actuators.seen_commands import SeenCommands
from clocktower.actuators.simulated_routing import SimulatedRouting
from clocktower.actuators.simulated_shaper import SimulatedShaper
from clocktower.control.intent import CommandIntent
from clocktower.control.issuer import CommandIssuer
from clocktower.schemas.codec import encode_batch
from clocktower.schemas.control import ControlAck, ControlCommand
from clocktower.schemas.event import Event
from clocktower.schemas.operations import DeadLetter
from clocktower.schemas.partitioning import partition_of
from tests.control_keys import TEST_SIGNER, TEST_VERIFIER
from tests.standalone_broker import StandaloneBroker

TOPIC = "control.commands"
PARTITIONS = 4
NODE = "node-a"


def _sharing(node: str, same: bool) -> str:
    """A node name whose partition is (or is not) `node`'s."""
    want = partition_of(node, PARTITIONS)
    return next(f"node-{i}" for i in range(1000) if f"node-{i}" != node
                and (partition_of(f"node-{i}", PARTITIONS) == want) == same)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[StandaloneBroker]:
    b = StandaloneBroker(tmp_path / "kafka")
    b.start()
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    for fut in admin.create_topics([NewTopic(TOPIC, num_partitions=PARTITIONS, replication_factor=1)]).values():
        fut.result(15)
    try:
        yield b
    finally:
        b.stop()


def _send(bootstrap: str, records: list[tuple[str, bytes, bytes, list]]) -> None:
    p = Producer({"bootstrap.servers": bootstrap})
    for node, key, value, headers in records:
        p.produce(TOPIC, key=key, value=value, headers=headers, partition=partition_of(node, PARTITIONS))
    assert p.flush(15) == 0


def _command(node: str, target: str, i: int) -> ControlCommand:
    return CommandIssuer(TEST_SIGNER).issue(CommandIntent(node, "failover", target, time.time_ns() + i, f"inc-{i}",
                                                          {"from": target, "to": "eth9"}))


def _encoded(cmd: ControlCommand) -> tuple[str, bytes, bytes, list]:
    return (cmd.node, *encode_batch([cmd]))


class Run:
    """One actuator consumer on a thread, with the events it publishes collected."""

    def __init__(self, bootstrap: str, state: Path, routing: SimulatedRouting, shaper: SimulatedShaper | None = None,
                 **consumer: object) -> None:
        self.published: list[Event] = []
        self.actuator = actuator = Actuator(NODE, TEST_VERIFIER, routing, SeenCommands(state), Quarantine(state),
                                            Hooks({}), backups=lambda link: "eth9",   # every command here names eth9
                                            shaper=shaper)
        self.consumer = CommandConsumer(bootstrap, actuator, self.published.extend, metadata_refresh_s=0.5,
                                        **consumer)  # type: ignore[arg-type]
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.consumer.run, args=(self.stop,), daemon=True)
        self.thread.start()

    def wait(self, n: int, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.published) < n and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(self.published) >= n, (self.published, self.consumer.stats())

    def close(self) -> None:
        self.stop.set()
        self.thread.join(20)
        assert not self.thread.is_alive()


def test_the_actuator_acks_only_its_own_commands_and_not_again_after_a_restart(broker: StandaloneBroker,
                                                                             tmp_path: Path) -> None:
    neighbour, elsewhere = _sharing(NODE, True), _sharing(NODE, False)
    mine = [_command(NODE, f"eth{i}", i) for i in range(3)]
    theirs = [_command(neighbour, "eth0", 10), _command(elsewhere, "eth0", 11)]
    # a record keyed to this node that does not decode (no expiry) but names its id, and one that names none
    bad_value = b'[{"node": "node-a", "command_id": "bad-1", "action": "failover", "target": "eth5"}]'
    bad_headers = [("ct-schema", b"control_command"), ("ct-version", b"1"), ("ct-count", b"1")]
    _send(broker.bootstrap, [_encoded(mine[0]), _encoded(theirs[0]), _encoded(theirs[1]), _encoded(mine[1]),
                             (NODE, NODE.encode(), bad_value, bad_headers),
                             (NODE, NODE.encode(), b"not json", bad_headers), _encoded(mine[2])])
    routing = SimulatedRouting()
    run = Run(broker.bootstrap, tmp_path / "state", routing)
    try:
        run.wait(5)
        time.sleep(1.0)                      # nothing more comes
    finally:
        run.close()
    acks = [e for e in run.published if isinstance(e, ControlAck)]
    assert sorted(a.command_id for a in acks if a.status == "applied") == sorted(c.command_id for c in mine)
    assert all(a.node == NODE for a in acks)
    refused = [a for a in acks if a.status == "refused"]
    assert [(a.command_id, a.target) for a in refused] == [("bad-1", "eth5")] and "malformed" in refused[0].detail
    dead = [e for e in run.published if isinstance(e, DeadLetter)]
    assert len(dead) == 1 and dead[0].origin_topic == TOPIC
    assert len(run.published) == 5
    stats = run.consumer.stats()
    assert stats["partitions"] == [partition_of(NODE, PARTITIONS)]
    assert stats["foreign"] == 1, "the neighbour's command was skipped; the other partition was never read"
    assert all(routing.on_backup(f"eth{i}") for i in range(3))
    assert sorted(routing.history) == sorted(("fail_over", f"eth{i}", "eth9") for i in range(3))

    # restarted: the offsets were committed, nothing is handled (or acked) again; a new command is
    again = Run(broker.bootstrap, tmp_path / "state", routing)
    try:
        later = _command(NODE, "eth7", 20)
        _send(broker.bootstrap, [_encoded(later)])
        again.wait(1)
        time.sleep(1.0)
    finally:
        again.close()
    assert [(a.command_id, a.status) for a in again.published] == [(later.command_id, "applied")]  # type: ignore[attr-defined]


def test_the_consume_loop_lifts_a_qos_limit_whose_lease_runs_out_with_no_command_coming(broker: StandaloneBroker,
                                                                                        tmp_path: Path) -> None:
    """A `resume` that never comes: the limit is lifted one lease later by the running consumer, with nothing read."""
    cmd = CommandIssuer(TEST_SIGNER).issue(CommandIntent(NODE, "rate_limit", "low", time.time_ns(), "inc-q",
                                                         {"share": "0.25", "lease_s": "1", "toward": "node-b"}))
    _send(broker.bootstrap, [_encoded(cmd)])
    shaper = SimulatedShaper()
    run = Run(broker.bootstrap, tmp_path / "state", SimulatedRouting(), shaper)
    try:
        run.wait(1)
        deadline = time.monotonic() + 15
        while shaper.low_share() != 1.0 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        run.close()
    [ack] = run.published
    assert isinstance(ack, ControlAck) and ack.status == "applied" and "capped at 25%" in ack.detail
    assert shaper.low_share() == 1.0 and run.actuator.leases_expired == 1


def test_a_new_actuator_starts_at_the_last_command_lifetime_and_finds_its_partition_after_growth(
        broker: StandaloneBroker, tmp_path: Path) -> None:
    """No committed offset: commands older than the longest lifetime are not read (they have expired); the
    topic grows to 8 partitions: the node's new partition is added and read."""
    old = CommandIssuer(TEST_SIGNER).issue(CommandIntent(NODE, "failover", "eth0", time.time_ns() - 2 * 3600 * 10**9,
                                                         "inc-old", {"from": "eth0", "to": "eth9"}))
    p = Producer({"bootstrap.servers": broker.bootstrap})
    key, value, headers = encode_batch([old])
    p.produce(TOPIC, key=key, value=value, headers=headers, partition=partition_of(NODE, PARTITIONS),
              timestamp=old.ts_ns // 10**6)
    assert p.flush(15) == 0
    fresh = _command(NODE, "eth1", 1)
    _send(broker.bootstrap, [_encoded(fresh)])
    run = Run(broker.bootstrap, tmp_path / "state", SimulatedRouting())
    try:
        run.wait(1)
        grown = next(n for n in range(5, 64) if partition_of(NODE, n) != partition_of(NODE, PARTITIONS))
        from confluent_kafka.admin import NewPartitions
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        for fut in admin.create_partitions([NewPartitions(TOPIC, grown)]).values():
            fut.result(15)
        deadline = time.monotonic() + 20
        while len(run.consumer.stats()["partitions"]) < 2 and time.monotonic() < deadline:  # type: ignore[arg-type]
            time.sleep(0.1)
        assert run.consumer.stats()["partitions"] == [partition_of(NODE, PARTITIONS), partition_of(NODE, grown)]
        after = _command(NODE, "eth2", 2)
        p.produce(TOPIC, key=NODE.encode(), value=encode_batch([after])[1], headers=encode_batch([after])[2],
                  partition=partition_of(NODE, grown))
        assert p.flush(15) == 0
        run.wait(2)
    finally:
        run.close()
    assert [a.command_id for a in run.published] == [fresh.command_id, after.command_id]  # type: ignore[attr-defined]


def test_a_committed_offset_past_the_log_end_restarts_at_the_last_command_lifetime(broker: StandaloneBroker,
                                                                                    tmp_path: Path) -> None:
    """The broker lost records under the committed offset: the actuator reads the last lifetime again (ids it
    handled are refused as replays, none is applied twice), instead of stalling or re-reading all retention."""
    from confluent_kafka import Consumer

    from clocktower.actuators.command_consumer import group_of
    cmd = _command(NODE, "eth0", 1)
    _send(broker.bootstrap, [_encoded(cmd)])
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group_of(NODE), "enable.auto.commit": False})
    c.commit(offsets=[TopicPartition(TOPIC, partition_of(NODE, PARTITIONS), 1000)], asynchronous=False)
    c.close()
    run = Run(broker.bootstrap, tmp_path / "state", SimulatedRouting())
    try:
        run.wait(1)
    finally:
        run.close()
    assert [(a.command_id, a.status) for a in run.published] == [(cmd.command_id, "applied")]  # type: ignore[attr-defined]
    assert run.consumer.stats()["offset_resets"] == 1


# -- unit tests with a fake consumer (no broker) -------------------------------------------------------------------

class _Msg:
    """Just enough of a confluent_kafka Message: one record of `partition`."""

    def __init__(self, partition: int, offset: int, record: tuple[bytes, bytes, list]) -> None:
        self._partition, self._offset, self._record = partition, offset, record

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return TOPIC

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes:
        return self._record[0]

    def value(self) -> bytes:
        return self._record[1]

    def headers(self) -> list:
        return self._record[2]


class _Log:
    """The topic's one partition as the fake consumers see it (shared: it outlives a rebuilt consumer)."""

    def __init__(self) -> None:
        self.records: list[tuple[bytes, bytes, list]] = []
        self.committed = -1001                  # librdkafka's OFFSET_INVALID: nothing committed
        self.consumers: list[_FakeConsumer] = []
        self.failing_commits = 0                # the next n commits raise a transport error
        self.end_lookups = 0
        self.lifetime_start = 0                 # what offsets_for_times answers (-1: no record since then)
        self.arrives_after_time_lookup: tuple | None = None   # a record appended as offsets_for_times answers


class _FakeConsumer:
    """A Consumer over `_Log`, built by CommandConsumer in place of confluent_kafka's."""

    def __init__(self, log: _Log) -> None:
        from types import SimpleNamespace
        self.log, self.position, self.assigned, self.closed = log, None, [], False
        self._meta = SimpleNamespace(topics={TOPIC: SimpleNamespace(error=None, partitions={0: None})})
        log.consumers.append(self)

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> object:
        assert not self.closed
        return self._meta

    def committed(self, parts: list[TopicPartition], timeout: float = -1) -> list[TopicPartition]:
        return [TopicPartition(TOPIC, 0, self.log.committed)]

    def offsets_for_times(self, parts: list[TopicPartition], timeout: float = -1) -> list[TopicPartition]:
        found = TopicPartition(TOPIC, 0, self.log.lifetime_start)
        if self.log.arrives_after_time_lookup is not None:   # a command written just after the time lookup answered
            self.log.records.append(self.log.arrives_after_time_lookup)
            self.log.arrives_after_time_lookup = None
        return [found]

    def get_watermark_offsets(self, part: TopicPartition, timeout: float = -1, cached: bool = False) -> tuple[int, int]:
        self.log.end_lookups += 1
        return 0, len(self.log.records)

    def incremental_assign(self, parts: list[TopicPartition]) -> None:
        self.assigned += parts
        offset = parts[0].offset
        # the logical end is resolved only at the first fetch: whatever was produced meanwhile is skipped
        self.position = offset if offset >= 0 else ("end" if offset == -1 else 0)

    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition(TOPIC, 0)] if self.assigned else []

    def pause(self, parts: list[TopicPartition]) -> None:
        pass

    def resume(self, parts: list[TopicPartition]) -> None:
        pass

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[_Msg]:
        assert not self.closed
        if self.position == "end":
            self.position = len(self.log.records)
        if self.position is None or self.position >= len(self.log.records):
            time.sleep(min(timeout, 0.01))
            return []
        msgs = [_Msg(0, o, self.log.records[o]) for o in range(self.position, len(self.log.records))][:num_messages]
        self.position += len(msgs)
        return msgs

    def commit(self, offsets: list[TopicPartition], asynchronous: bool = True) -> None:
        from confluent_kafka import KafkaError, KafkaException
        if self.log.failing_commits:
            self.log.failing_commits -= 1
            raise KafkaException(KafkaError(KafkaError._TRANSPORT))
        self.log.committed = offsets[0].offset

    def close(self) -> None:
        if self.closed:
            raise RuntimeError("Consumer closed")
        self.closed = True


@pytest.fixture
def fake_log(monkeypatch: pytest.MonkeyPatch) -> _Log:
    from clocktower.actuators import command_consumer
    log = _Log()
    monkeypatch.setattr(command_consumer, "Consumer", lambda config: _FakeConsumer(log))
    return log


def _wait_for(what: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not what() and time.monotonic() < deadline:
        time.sleep(0.01)
    return what()


def test_a_failed_commit_rebuilds_the_consumer_and_applies_nothing_twice(fake_log: _Log, tmp_path: Path) -> None:
    """The synchronous commit fails (the broker's transport): the loop is rebuilt after a backoff, not ended with
    the thread dead; it resumes after the record it handled (nothing acked twice) and commits it then."""
    first, second = _command(NODE, "eth0", 1), _command(NODE, "eth1", 2)
    fake_log.records.append(encode_batch([first]))
    fake_log.failing_commits = 1
    run = Run("fake:9092", tmp_path / "state", SimulatedRouting())
    try:
        run.wait(1)
        assert _wait_for(lambda: len(fake_log.consumers) == 2), "the consumer was not rebuilt after the commit error"
        stats = run.consumer.stats()
        assert stats["alive"] is True and run.thread.is_alive()
        assert stats["loop_restarts"] == 1 and "_TRANSPORT" in str(stats["last_error"]), stats
        assert fake_log.consumers[0].closed
        assert [tp.offset for tp in fake_log.consumers[1].assigned] == [1], "resumed after the handled record"
        assert _wait_for(lambda: fake_log.committed == 1), "the handled record's offset is committed after all"
        fake_log.records.append(encode_batch([second]))
        run.wait(2)
    finally:
        run.close()
    assert [(a.command_id, a.status) for a in run.published] == [  # type: ignore[attr-defined]
        (first.command_id, "applied"), (second.command_id, "applied")]
    assert fake_log.committed == 2
    assert run.consumer.stats()["alive"] is False


def test_a_command_written_between_the_time_and_end_lookups_is_read(fake_log: _Log, tmp_path: Path) -> None:
    """The time lookup finds no recent command; one is written right after it answers. The start is the end read
    before that lookup, so the command is read (the end read after it skipped it: seen once in the full suite)."""
    from clocktower.actuators.actuator import Actuator as _Actuator
    fake_log.lifetime_start = -1
    cmd = _command(NODE, "eth1", 1)
    fake_log.arrives_after_time_lookup = encode_batch([cmd])
    state = tmp_path / "state"
    actuator = _Actuator(NODE, TEST_VERIFIER, SimulatedRouting(), SeenCommands(state), Quarantine(state), Hooks({}),
                         backups=lambda link: "eth9")
    consumer = CommandConsumer("fake:9092", actuator, [].extend)
    assert consumer._assign_own()
    assert len(fake_log.records) == 1, "the command was written during the lookups"
    assert [tp.offset for tp in fake_log.consumers[0].assigned] == [0], "it is read"


def test_a_new_group_with_no_recent_command_starts_at_an_absolute_end(fake_log: _Log, tmp_path: Path) -> None:
    """No committed offset, no record in the last lifetime: the start is the end read then (an absolute offset),
    so a command produced before the first fetch is read, not skipped as the logical OFFSET_END would."""
    from clocktower.actuators.actuator import Actuator as _Actuator
    old = CommandIssuer(TEST_SIGNER).issue(CommandIntent(NODE, "failover", "eth0", time.time_ns() - 2 * 3600 * 10**9,
                                                         "inc-old", {"from": "eth0", "to": "eth9"}))
    fake_log.records.append(encode_batch([old]))       # expired: not in the last lifetime
    fake_log.lifetime_start = -1
    published: list[Event] = []
    state = tmp_path / "state"
    actuator = _Actuator(NODE, TEST_VERIFIER, SimulatedRouting(), SeenCommands(state), Quarantine(state), Hooks({}),
                         backups=lambda link: "eth9")
    consumer = CommandConsumer("fake:9092", actuator, published.extend)
    assert consumer._assign_own()
    assert [tp.offset for tp in fake_log.consumers[0].assigned] == [1] and fake_log.end_lookups == 1
    fresh = _command(NODE, "eth1", 1)
    fake_log.records.append(encode_batch([fresh]))      # produced between the lookup and the first fetch
    stop = threading.Event()
    thread = threading.Thread(target=consumer.run, args=(stop,), daemon=True)
    thread.start()
    try:
        assert _wait_for(lambda: len(published) == 1), consumer.stats()
    finally:
        stop.set()
        thread.join(10)
    assert [(a.command_id, a.status) for a in published] == [(fresh.command_id, "applied")]  # type: ignore[attr-defined]


def test_a_flood_of_forged_commands_gets_few_refused_acks_and_the_genuine_one_is_applied(
        broker: StandaloneBroker, tmp_path: Path) -> None:
    """Issue 18: every one of 261k forged commands got a refused ack, and genuine commands waited 44 s behind
    them. Refused acks are rate-limited; the genuine command after the flood is applied and acked."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from clocktower.actuators.command_consumer import REFUSED_ACKS_BURST, REFUSED_ACKS_PER_S
    from clocktower.control.signing import CommandSigner

    forger = CommandIssuer(CommandSigner(Ed25519PrivateKey.generate()))
    now = time.time_ns()
    flood = [forger.issue(CommandIntent(NODE, "failover", "eth0", now + i, f"forged-{i}", {"from": "eth0",
                                                                                             "to": "eth9"}))
             for i in range(1000)]
    genuine = _command(NODE, "eth1", 1)
    p = Producer({"bootstrap.servers": broker.bootstrap})
    for start in range(0, len(flood), 100):   # 100 forged commands a record
        key, value, headers = encode_batch(flood[start:start + 100])
        p.produce(TOPIC, key=key, value=value, headers=headers, partition=partition_of(NODE, PARTITIONS))
    assert p.flush(15) == 0
    _send(broker.bootstrap, [_encoded(genuine)])
    started = time.monotonic()
    run = Run(broker.bootstrap, tmp_path / "state", SimulatedRouting())
    try:
        deadline = time.monotonic() + 30
        while not any(getattr(e, "command_id", "") == genuine.command_id for e in run.published):
            assert time.monotonic() < deadline, run.consumer.stats()
            time.sleep(0.05)
        elapsed = time.monotonic() - started
    finally:
        run.close()
    refused = [e for e in run.published if isinstance(e, ControlAck) and e.status == "refused"]
    assert all("bad signature" in a.detail for a in refused)
    assert len(refused) <= REFUSED_ACKS_BURST + REFUSED_ACKS_PER_S * elapsed + 1, (len(refused), elapsed)
    stats = run.consumer.stats()
    assert stats["acks_refused"] == 1000 and stats["refused_acks_dropped"] == 1000 - len(refused)
    assert [a.status for a in run.published if getattr(a, "command_id", "") == genuine.command_id] == ["applied"]


def test_a_fetch_response_over_100_mb_does_not_wedge_the_actuator(broker: StandaloneBroker, tmp_path: Path) -> None:
    """Issue 18 finding 1: the embedded broker ignores fetch.max.bytes, so 110 MiB written to a node's partition
    came back as one response over librdkafka's 100 MB receive.message.max.bytes, and the actuator never read (or
    acked) again. Under the embedded profile (CommandConsumer's default) the ceiling is librdkafka's maximum; with
    `consumer_extra={}` (librdkafka's default ceiling) this test fails: nothing is acked."""
    import os

    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5, "batch.size": 1_000_000})
    junk = os.urandom(900_000)                         # under the topic's 1 MiB record limit; names no command
    for _ in range(125):                               # 112 MB
        p.produce(TOPIC, key=NODE.encode(), value=junk, partition=partition_of(NODE, PARTITIONS))
        p.poll(0)
    assert p.flush(60) == 0
    genuine = _command(NODE, "eth1", 1)
    _send(broker.bootstrap, [_encoded(genuine)])
    run = Run(broker.bootstrap, tmp_path / "state", SimulatedRouting())
    try:
        deadline = time.monotonic() + 60
        while not any(getattr(e, "command_id", "") == genuine.command_id for e in run.published):
            assert time.monotonic() < deadline, run.consumer.stats()
            time.sleep(0.1)
    finally:
        run.close()
    assert [a.status for a in run.published if getattr(a, "command_id", "") == genuine.command_id] == ["applied"]
    assert run.consumer.stats()["deadlettered"] == 125
