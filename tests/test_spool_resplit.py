"""Records spooled under the old, larger record limit are cut into parts on replay, not rejected.

A spool written before the upgrade holds records up to 4 MiB of value; the producer now refuses anything over
MAX_MESSAGE_BYTES for good. A fake librdkafka producer stands in for the broker (it refuses oversized records at
produce() as librdkafka does), so the replay path runs without one.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from clocktower.producers.spool import Spool, SpoolRecord
from clocktower.producers.spool_resplit import part_rid, resplit
from clocktower.producers.spooling_publisher import RID_HEADER, SpoolingPublisher
from clocktower.schemas.codec import decode_batch, encode_batch
from clocktower.schemas.record_mac import check, node_key, sign
from clocktower.schemas.topics import MAX_MESSAGE_BYTES, MAX_RECORD_BYTES
from tests.event_samples import gpu_health

GPU = "telemetry.gpu"
PRODUCER_KEY = b"p" * 40
NODE = "node-0"
PARENT_RID = b"oldinstance-0"


class FakeProducer:
    """librdkafka's produce/poll/purge: acks the first `ack_limit` records at poll, holds the rest."""

    def __init__(self, ack_limit: int = 10**9) -> None:
        self.ack_limit = ack_limit
        self.acked: list[tuple[str, bytes, bytes, list]] = []
        self.produced = 0
        self._waiting: list = []
        self._lock = threading.Lock()

    def produce(self, topic: str, key: bytes, value: bytes, headers: list, timestamp: int, on_delivery) -> None:  # noqa: ANN001
        if len(value) > MAX_MESSAGE_BYTES:   # message.max.bytes: librdkafka refuses it at once
            raise KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "too large"))
        with self._lock:
            self.produced += 1
            self._waiting.append(((topic, key, value, headers), on_delivery))

    def poll(self, timeout: float = 0) -> int:
        with self._lock:
            room = max(0, self.ack_limit - len(self.acked))
            done, self._waiting = self._waiting[:room], self._waiting[room:]
            self.acked += [rec for rec, _ in done]
        for _, cb in done:
            cb(None, None)
        time.sleep(min(timeout, 0.01))
        return len(done)

    def list_topics(self, timeout: float | None = None) -> None:
        return None

    def flush(self, timeout: float | None = None) -> int:
        self.poll(0)
        return len(self._waiting)

    def fail_waiting(self) -> None:
        """Every record not acked times out (the broker went away)."""
        with self._lock:
            waiting, self._waiting = self._waiting, []
        for _, cb in waiting:
            cb(KafkaError(KafkaError._MSG_TIMED_OUT, "timed out"), None)

    def purge(self) -> None:
        with self._lock:
            waiting, self._waiting = self._waiting, []
        for _, cb in waiting:
            cb(KafkaError(KafkaError._PURGE_QUEUE, "purged"), None)


def _old_spool(spool_dir: Path, n: int = 5500) -> list:
    """A spool as the old publisher left it: one signed gpu_health record of about 2.8 MB, then a small one."""
    events = [gpu_health(node=NODE, ts_ns=time.time_ns() + i, gpu=i % 8, uuid=f"GPU-{i % 8}-" + "u" * 40)
              for i in range(n)]
    key, value, headers = encode_batch(events)
    assert MAX_RECORD_BYTES < len(value) < 4 * 1024 * 1024
    signed = sign(node_key(PRODUCER_KEY, NODE), GPU, key, value, headers)
    tail = [gpu_health(node=NODE, ts_ns=time.time_ns() + n)]
    k2, v2, h2 = encode_batch(tail)
    spool = Spool(spool_dir)
    spool.append(SpoolRecord(1, GPU, key, value, [*signed, (RID_HEADER, PARENT_RID)], int(time.time() * 1000)))
    spool.append(SpoolRecord(2, GPU, k2, v2, [*h2, (RID_HEADER, b"oldinstance-1")], int(time.time() * 1000)))
    spool.close()
    return events + tail


def _open(spool_dir: Path, fake: FakeProducer, present: set[bytes] = frozenset(),  # type: ignore[assignment]
          max_record_bytes: int = MAX_RECORD_BYTES, **kw: Any) -> SpoolingPublisher:
    """A publisher on `spool_dir` whose broker is `fake` (the real one points at a closed port: never up)."""
    pub = SpoolingPublisher("127.0.0.1:9", spool_dir, probe_interval_s=0.05, probe_timeout_s=0.05, **kw)
    with pub._lock:
        pub.max_record_bytes = max_record_bytes
        pub.producer = fake  # type: ignore[assignment]
        pub.node_key = node_key(PRODUCER_KEY, NODE)
        pub._find_present = lambda topics, since_ms: set(present)  # type: ignore[method-assign]
    return pub


def _wait(cond, timeout: float = 20) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _events(records: list) -> list:
    """The events of records as the streams and the sink decode them: every envelope rule applies."""
    return [e for topic, k, v, h in records for e in decode_batch(topic, k, v, h).events]



def _drain(spool: Path, producer: FakeProducer, present: set[bytes] = frozenset()) -> dict:
    """A publisher on `spool` whose read-back finds the record ids `present`: run until the spool is empty.
    Returns its stats, with its failed events per schema under "failed"."""
    pub = _open(spool, producer, present=present)
    try:
        _wait(lambda: pub.spool.pending_records == 0)
        return {**pub.stats(), "failed": dict(pub.failed)}
    finally:
        pub.close(timeout=0)


def _restart_with_what_kafka_has(spool: Path, first: FakeProducer) -> tuple[FakeProducer, dict]:
    """A new publisher on the same spool whose read-back finds the records `first` got acked."""
    second = FakeProducer()
    return second, _drain(spool, second, {dict(h)[RID_HEADER] for *_, h in first.acked})


def test_an_old_oversized_spooled_record_is_sent_as_signed_parts_in_order(tmp_path: Path) -> None:
    events = _old_spool(tmp_path / "spool")
    fake = FakeProducer()
    stats = _drain(tmp_path / "spool", fake)
    assert stats["rejected_records"] == 0 and stats["resplit_records"] == 1 and stats["refused"] == 0
    assert stats["acked"] == len(events)
    parts = fake.acked[:-1]
    assert len(parts) >= 3 and all(len(v) <= MAX_RECORD_BYTES for _, _, v, _ in fake.acked)
    assert _events(fake.acked) == events, "every event once, in the spooled order, the small record after the parts"
    for topic, k, v, h in parts:
        assert check(PRODUCER_KEY, topic, k, v, h) is None, "each part is signed afresh (the old MAC covers the whole)"
    rids = [dict(h)[RID_HEADER] for *_, h in fake.acked]
    assert rids == [part_rid(PARENT_RID, i) for i in range(len(rids) - 1)] + [b"oldinstance-1"]


def test_parts_acked_before_a_restart_are_not_sent_again(tmp_path: Path) -> None:
    """Stopped mid-way: the record stays spooled; the next run cuts it the same way and sends only what Kafka lacks."""
    events = _old_spool(tmp_path / "spool")
    first = FakeProducer(ack_limit=2)
    pub = _open(tmp_path / "spool", first)
    try:
        _wait(lambda: len(first.acked) == 2 and first.produced > 2)
        assert pub.spool.pending_records == 2, "the cut record leaves the spool only once every part is resolved"
    finally:
        pub.close(timeout=0)
    second, stats = _restart_with_what_kafka_has(tmp_path / "spool", first)
    assert stats["deduplicated"] == 2 and stats["rejected_records"] == 0
    assert _events(first.acked + second.acked) == events, "each part once: none lost, none doubled"


def test_a_spooled_record_over_the_limit_that_does_not_decode_is_rejected(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool")
    spool.append(SpoolRecord(1, GPU, b"n", b"[" + b" " * (2 * MAX_RECORD_BYTES) + b"]",
                             [("ct-schema", b"gpu_health"), ("ct-version", b"1"), ("ct-count", b"3")], 0))
    spool.close()
    fake = FakeProducer()
    stats = _drain(tmp_path / "spool", fake)
    assert stats["rejected_records"] == 1 and stats["resplit_records"] == 0 and fake.acked == []
    assert stats["failed"]["gpu_health"] == 3


def test_an_event_too_big_for_any_record_is_refused_and_counted_the_rest_sent(tmp_path: Path) -> None:
    """A spooled batch with one event bigger than a record holds; scaled down: a 700-byte limit, the big event
    encodes to 868 bytes, the others to 465."""
    events = [gpu_health(node=NODE, ts_ns=time.time_ns() + i, gpu=i) for i in range(6)]
    events[3] = gpu_health(node=NODE, ts_ns=events[3].ts_ns, gpu=3, uuid="GPU-" + "x" * 250,
                           nvlink_errors=list(range(18)), throttle=["hw_slowdown"] * 8)
    key, value, headers = encode_batch(events)
    spool = Spool(tmp_path / "spool")
    spool.append(SpoolRecord(1, GPU, key, value, [*headers, (RID_HEADER, PARENT_RID)], int(time.time() * 1000)))
    spool.close()
    fake = FakeProducer()
    pub = _open(tmp_path / "spool", fake, max_record_bytes=700)
    try:
        _wait(lambda: pub.spool.pending_records == 0)
        stats = pub.stats()
    finally:
        pub.close(timeout=0)
    assert _events(fake.acked) == events[:3] + events[4:]
    assert stats["refused"] == 1 and pub.refused_spooled["gpu_health"] == 1 and not pub.refused
    assert stats["acked"] == 5 and stats["rejected_records"] == 0
    assert any("more than a record holds" in e for e in pub.errors)


def test_a_record_dropped_from_a_full_spool_mid_way_counts_only_its_parts_not_delivered(tmp_path: Path) -> None:
    """Acked parts count as acked, parts in flight when the spool dropped it count as dropped once they fail."""
    events = _old_spool(tmp_path / "spool")
    fake = FakeProducer(ack_limit=1)
    pub = _open(tmp_path / "spool", fake, max_spool_bytes=3_000_000, segment_bytes=64 * 1024)
    results: list = []
    with pub._lock:        # as publish_raw registers it (callbacks do not survive a restart: set by hand here)
        pub._callbacks[1] = lambda err, _msg: results.append(err)
    try:
        _wait(lambda: len(fake.acked) == 1 and fake.produced >= 4)        # 3 parts and the small record
        part0 = pub.acked["gpu_health"]
        with pub._lock:
            in_flight = sum(p.rec.events for p in pub._inflight.values())
        assert part0 + in_flight == len(events)
        pub.publish([gpu_health(node="node-1", ts_ns=time.time_ns() + i, gpu=i % 8) for i in range(600)])
        _wait(lambda: pub.spool.pending_records and 1 not in {e.seq for e in pub.spool.entries()})
        assert pub.stats()["dropped_events"] == 0, "its parts are still on their way"
        fake.fail_waiting()
        _wait(lambda: pub.stats()["dropped_events"] == in_flight)
        stats = pub.stats()
    finally:
        pub.close(timeout=0)
    assert stats["dropped_records"] == 3 and stats["acked"] == part0
    assert [e.code() for e in results] == [KafkaError._QUEUE_FULL], "told once that not all of it went"


def test_publish_raw_rejects_a_value_over_the_record_limit_at_once(tmp_path: Path) -> None:
    """Consumers would refuse it: it is neither sent nor spooled (re-splitting is for old spools only)."""
    key, value, headers = encode_batch([gpu_health(node=NODE, ts_ns=time.time_ns() + i, gpu=i) for i in range(6)])
    fake = FakeProducer()
    pub = _open(tmp_path / "spool", fake, max_record_bytes=len(value) - 1)
    results: list = []
    try:
        pub.publish_raw(GPU, key, value, headers, on_delivery=lambda err, _msg: results.append(err))
        stats = pub.stats()
    finally:
        pub.close(timeout=0)
    assert fake.produced == 0 and stats["spooled"] == 0 and stats["resplit_records"] == 0
    assert stats["rejected_records"] == 1 and pub.failed["gpu_health"] == 6
    assert [e.code() for e in results] == [KafkaError.MSG_SIZE_TOO_LARGE]
    assert "over the record limit" in results[0].str() and results[0].str() in pub.errors


def _outage_after_two_parts(spool_dir: Path) -> tuple[FakeProducer, SpoolingPublisher]:
    """Two parts acked, then the broker goes away within ack_hold_s: the held parts are in doubt again."""
    first = FakeProducer(ack_limit=2)
    pub = _open(spool_dir, first, ack_hold_s=30)
    _wait(lambda: len(first.acked) == 2 and first.produced > 2)
    first.fail_waiting()
    _wait(lambda: pub.stats()["respooled"] == 2 and not pub.broker_up)
    return first, pub


def test_parts_in_doubt_after_an_outage_are_not_sent_again_after_a_restart(tmp_path: Path) -> None:
    """The held parts are not spooled again as copies beside their parent (which, cut again after the restart,
    would match the ct-rids the read-back found and leave the copies to be sent a second time)."""
    events = _old_spool(tmp_path / "spool")
    first, pub = _outage_after_two_parts(tmp_path / "spool")
    try:
        assert pub.spool.pending_records == 2, "the parent covers its parts in doubt: no copies beside it"
    finally:
        pub.close(timeout=0)
    second, stats = _restart_with_what_kafka_has(tmp_path / "spool", first)
    assert _events(first.acked + second.acked) == events, "each part once: none lost, none doubled"
    assert stats["deduplicated"] == 2 and stats["acked"] == len(events)


def test_parts_in_doubt_are_resent_only_if_kafka_lost_them_and_counted_once(tmp_path: Path) -> None:
    """Same process: the broker comes back having kept part 0 and lost part 1."""
    events = _old_spool(tmp_path / "spool")
    first, pub = _outage_after_two_parts(tmp_path / "spool")
    try:
        kept = dict(first.acked[0][3])[RID_HEADER]
        with pub._lock:
            pub._find_present = lambda topics, since_ms: {kept}  # type: ignore[method-assign]
            first.ack_limit = 10**9
            first.acked = first.acked[:1]
        _wait(lambda: pub.spool.pending_records == 0)
        stats = pub.stats()
    finally:
        pub.close(timeout=0)
    assert _events(first.acked) == events, "part 1 resent, in its place; part 0 not resent"
    assert stats["acked"] == len(events), "the parts acked before the outage count once"
    assert stats["deduplicated"] == 1


def test_a_spool_holding_copies_of_parts_beside_their_parent_sends_each_part_once(tmp_path: Path) -> None:
    """Spools written by an earlier version may hold acked parts spooled again after their parent: every copy
    of a ct-rid Kafka has is skipped for the whole replay round, and counted once."""
    events = _old_spool(tmp_path / "spool")
    spool = Spool(tmp_path / "spool")
    parent = spool.read_next(0)
    assert parent is not None and parent.seq == 1
    cut = resplit(parent, MAX_RECORD_BYTES)
    sent = []
    for i in (0, 1):
        part = cut.parts[i]
        headers = [*sign(node_key(PRODUCER_KEY, NODE), GPU, part.key, part.value, part.headers),
                   (RID_HEADER, part_rid(PARENT_RID, i))]
        sent.append((GPU, part.key, part.value, headers))
        spool.append(SpoolRecord(3 + i, GPU, part.key, part.value, headers, parent.ts_ms))
    spool.close()
    fake = FakeProducer()
    pub = _open(tmp_path / "spool", fake, present={part_rid(PARENT_RID, 0), part_rid(PARENT_RID, 1)})
    try:
        _wait(lambda: pub.spool.pending_records == 0)
        stats = pub.stats()
    finally:
        pub.close(timeout=0)
    assert _events(sent + fake.acked) == events, "the copies are not sent: Kafka has them"
    assert stats["deduplicated"] == 4 and stats["acked"] == len(events)
