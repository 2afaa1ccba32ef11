"""SpoolingPublisher: nothing lost, nothing doubled, order kept, while the real embedded broker goes away.

The broker is the noida-db binary itself (as clocktower.stack starts it), stopped with SIGINT and restarted
on the same port and data dir. Events carry a per-node sequence number (GpuHealth.ecc_corrected) so the
consumer side can check exact counts and order per key.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from clocktower.ports import free_port
from clocktower.producers.spool import Spool, SpoolRecord, encode_frame
from clocktower.producers.spooling_publisher import RID_HEADER, SpoolingPublisher
from clocktower.schemas.codec import decode_batch
from clocktower.schemas.telemetry import GpuHealth, LinkState
from clocktower.topic_admin import ensure_topics
from tests.event_samples import GPU_READINGS
from tests.standalone_broker import StandaloneBroker

REPO = Path(__file__).resolve().parents[1]
T0 = time.time_ns()
TOPIC = "telemetry.gpu"


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[StandaloneBroker]:
    b = StandaloneBroker(tmp_path / "kafka")
    try:
        yield b
    finally:
        b.stop()


def gpu_batch(node: str, first: int, n: int) -> list[GpuHealth]:
    """n readings from `node` with per-node sequence numbers first..first+n-1 (in ecc_corrected)."""
    return [GpuHealth(node=node, ts_ns=T0 + (first + i) * 1000, gpu=0, uuid=f"GPU-{node}",
                      **{**GPU_READINGS, "temperature_c": 60.0, "ecc_corrected": first + i}) for i in range(n)]


def consume_all(bootstrap: str, topic: str, timeout: float = 20.0) -> list[tuple[int, str, int]]:
    """Every event of `topic` as (partition, node, seq), in offset order per partition."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{time.monotonic_ns()}",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        parts = sorted(c.list_topics(topic, timeout=10).topics[topic].partitions)
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts}
        c.assign([TopicPartition(topic, p, 0) for p in parts])
        out: list[tuple[int, str, int]] = []
        pos = dict.fromkeys(parts, 0)
        deadline = time.monotonic() + timeout
        while any(pos[p] < ends[p] for p in parts) and time.monotonic() < deadline:
            for m in c.consume(500, timeout=0.5):
                if m.error() is not None:
                    continue
                batch = decode_batch(m.topic(), m.key(), m.value(), m.headers())
                out += [(m.partition(), e.node, e.ecc_corrected) for e in batch.events]
                pos[m.partition()] = m.offset() + 1
        assert all(pos[p] >= ends[p] for p in parts), f"read up to {pos}, end offsets {ends}"
        return out
    finally:
        c.close()


def assert_exactly_once_in_order(events: list[tuple[int, str, int]], published: Counter[str]) -> None:
    per_node: dict[str, list[int]] = defaultdict(list)
    partition_of: dict[str, set[int]] = defaultdict(set)
    for part, node, seq in events:
        per_node[node].append(seq)
        partition_of[node].add(part)
    assert sorted(per_node) == sorted(published)
    for node, seqs in per_node.items():
        assert len(partition_of[node]) == 1, f"{node} spread over partitions {partition_of[node]}"
        if seqs != list(range(published[node])):
            dups = [s for s, k in Counter(seqs).items() if k > 1]
            missing = sorted(set(range(published[node])) - set(seqs))
            raise AssertionError(f"{node}: {len(seqs)} events for {published[node]} published; "
                                 f"{len(dups)} doubled {dups[:5]}, {len(missing)} missing {missing[:5]}, "
                                 f"in order: {seqs == sorted(seqs)}")


def wait_for(cond, timeout: float, what: str) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


# --- the real outage ---------------------------------------------------------------------------------------
def test_broker_outage_mid_stream_loses_nothing_doubles_nothing(broker: StandaloneBroker, tmp_path: Path) -> None:
    broker.start()
    ensure_topics(broker.bootstrap)
    nodes = [f"node-{i}" for i in range(6)]
    published: Counter[str] = Counter()
    pub = SpoolingPublisher(broker.bootstrap, tmp_path / "spool", max_events_per_record=40)
    try:
        wait_for(lambda: pub.broker_up, 10, "the first probe")

        def publish_for(seconds: float) -> None:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                for node in nodes:
                    pub.publish(gpu_batch(node, published[node], 30))
                    published[node] += 30
                time.sleep(0.02)

        publish_for(1.5)
        assert pub.stats()["spooled"] == 0, "nothing should be spooled while the broker is up"
        before_outage = sum(published.values())
        broker.stop()
        t_down = time.monotonic()
        publish_for(2.5)
        during = pub.stats()
        assert during["broker_up"] is False
        assert during["spooled"] > 0 and during["spool_records"] > 0
        broker.start()
        t_back = time.monotonic()
        publish_for(1.0)
        left = pub.flush(30)
        t_done = time.monotonic()
        assert left == 0, f"{left} records still outstanding: {pub.stats()}"
        st = pub.stats()
    finally:
        pub.close()

    total = sum(published.values())
    assert total > before_outage + 2000
    assert st["acked"] == total and st["dropped_events"] == 0 and st["rejected_records"] == 0
    assert st["replayed"] > 0 and st["spool_records"] == 0
    events = consume_all(broker.bootstrap, TOPIC)
    assert len(events) == total
    assert_exactly_once_in_order(events, published)
    print(f"\n{total} events, outage {t_back - t_down:.1f} s, drained {t_done - t_back:.1f} s after restart, {st}")


# --- the broker acks, then loses the records (kill -9 before its next snapshot) ---------------------------------
def _snapshot(data_dir: Path) -> tuple[int, int] | None:
    """Changes every time noida-db writes its state file (kafka.json, replaced by rename)."""
    try:
        st = (data_dir / "kafka.json").stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns


def _ack_then_kill(broker: StandaloneBroker, spool: Path,
                   hold_s: float) -> tuple[list[tuple[int, str, int]], dict] | None:
    """Publish, kill -9 the broker after the acks, restart it; None if a snapshot saved the acked records."""
    broker.start()
    ensure_topics(broker.bootstrap)
    pub = SpoolingPublisher(broker.bootstrap, spool, ack_hold_s=hold_s)
    try:
        wait_for(lambda: pub.broker_up, 10, "the first probe")
        pub.publish_batch(gpu_batch("node-h", 0, 10))
        assert pub.flush(10) == 0
        before = _snapshot(broker.data_dir)
        wait_for(lambda: _snapshot(broker.data_dir) != before, 5, "a broker snapshot holding the first batch")
        snap = _snapshot(broker.data_dir)
        for i in range(1, 20):
            pub.publish_batch(gpu_batch("node-h", i * 10, 10))
        assert pub.flush(10) == 0                      # all acknowledged with acks=all ...
        assert broker.proc is not None
        broker.proc.kill()                             # ... and the broker dies before writing them
        broker.proc.wait(10)
        if _snapshot(broker.data_dir) != snap:
            return None                                # a snapshot ran between the acks and the kill
        wait_for(lambda: not pub.broker_up, 10, "the publisher to see the broker gone")
        broker.start()
        wait_for(lambda: pub.broker_up and pub.flush(0.5) == 0, 60, "the publisher to deliver everything")
        st = pub.stats()
    finally:
        pub.close()
    return consume_all(broker.bootstrap, TOPIC), st


@pytest.mark.parametrize("hold_s", [5.0, 0.0], ids=["held", "not-held"])
def test_records_acked_then_lost_by_a_killed_broker_are_resent(tmp_path: Path, hold_s: float) -> None:
    # A snapshot may land between the acks and the kill on a loaded machine: then nothing was lost and the
    # try tells nothing, so it runs again on a fresh broker and spool, up to 4 times.
    for attempt in range(4):
        broker = StandaloneBroker(tmp_path / f"try{attempt}" / "kafka")
        try:
            result = _ack_then_kill(broker, tmp_path / f"try{attempt}" / "spool", hold_s)
        finally:
            broker.stop()
        if result is not None:
            break
    else:
        raise AssertionError("a snapshot ran between the acks and the kill in every try: inconclusive")
    events, st = result
    if hold_s:
        assert_exactly_once_in_order(events, Counter({"node-h": 200}))
        assert st["respooled"] == 20 and st["deduplicated"] == 1 and st["acked"] == 200, st
        assert st["acked_lost_records"] == 0, st
    else:                                              # what an ack from this broker is worth without the hold
        assert sorted(seq for _, _, seq in events) == list(range(10))
        # ... and it is counted (issue 18, finding 6): 19 acked records of 10 events were let go and lost
        assert (st["acked_lost_records"], st["acked_lost_events"]) == (19, 190), st


# --- spool full --------------------------------------------------------------------------------------------
def link_batch(r: int, n: int = 10) -> list[LinkState]:
    return [LinkState(node="node-a", ts_ns=T0 + r * 1000 + i, interface="eth0", kind="ethernet", up=True,
                      carrier_changes=r * n + i, speed_mbps=0, operstate="up", carrier=True) for i in range(n)]


def test_full_spool_drops_oldest_segments_and_counts_them(tmp_path: Path) -> None:
    unreachable = f"127.0.0.1:{free_port()}"
    max_bytes = 64 * 1024
    pub = SpoolingPublisher(unreachable, tmp_path / "spool", max_spool_bytes=max_bytes, probe_timeout_s=0.2)
    try:
        records = 300
        for r in range(records):
            pub.publish_batch(link_batch(r))
        st = pub.stats()
    finally:
        pub.close(timeout=0)
    assert st["broker_up"] is False and st["acked"] == 0 and st["in_flight"] == 0
    assert st["spooled"] == records
    assert st["dropped_records"] > 0
    assert st["dropped_records"] + st["spool_records"] == records
    assert st["dropped_events"] + st["spool_events"] == records * 10
    assert st["dropped_events"] == st["dropped_records"] * 10
    assert 0 < st["spool_bytes"] <= max_bytes
    assert sum(pub.failed.values()) == st["dropped_events"]

    # what is left is exactly the newest records, in order, and it survives a reopen
    spool = Spool(tmp_path / "spool", max_bytes)
    kept = []
    after = 0
    while (rec := spool.read_next(after)) is not None:
        kept.append(decode_batch("telemetry.links", rec.key, rec.value, rec.headers).events[0].carrier_changes // 10)
        after = rec.seq
    spool.close()
    assert kept == list(range(records - st["spool_records"], records))


# --- crash recovery -----------------------------------------------------------------------------------------
CHILD = textwrap.dedent("""
    import os, signal, sys, time
    from clocktower.producers.spooling_publisher import SpoolingPublisher
    from tests.test_spooling_publisher import gpu_batch
    bootstrap, spool_dir, batches = sys.argv[1], sys.argv[2], int(sys.argv[3])
    pub = SpoolingPublisher(bootstrap, spool_dir, compression="zstd")
    for b in range(batches):
        pub.publish(gpu_batch("node-c", b * 50, 50))
    assert pub.stats()["spool_records"] == batches, pub.stats()
    print("spooled", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)   # a crash: no flush, no close
""")


def crash_after_spooling(bootstrap: str, spool_dir: Path, batches: int) -> None:
    proc = subprocess.run([sys.executable, "-c", CHILD, bootstrap, str(spool_dir), str(batches)], cwd=REPO,
                          capture_output=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-3000:]
    assert b"spooled" in proc.stdout


def test_crash_while_broker_away_then_restart_replays_everything(broker: StandaloneBroker, tmp_path: Path) -> None:
    batches = 40
    crash_after_spooling(broker.bootstrap, tmp_path / "spool", batches)   # the broker is not up yet
    broker.start()
    ensure_topics(broker.bootstrap)
    pub = SpoolingPublisher(broker.bootstrap, tmp_path / "spool", compression="zstd")
    try:
        assert pub.stats()["spool_records"] == batches
        assert pub.flush(20) == 0, pub.stats()
        st = pub.stats()
    finally:
        pub.close()
    assert st["replayed"] == batches and st["acked"] == batches * 50 and st["deduplicated"] == 0
    assert not list((tmp_path / "spool").glob("*.seg")), "acked segments are deleted"
    events = consume_all(broker.bootstrap, TOPIC)
    assert_exactly_once_in_order(events, Counter({"node-c": batches * 50}))


def test_records_that_reached_kafka_before_a_crash_are_not_sent_again(broker: StandaloneBroker, tmp_path: Path) -> None:
    """The crash came after the broker stored some records but before the spool noted the acks."""
    batches = 30
    crash_after_spooling(broker.bootstrap, tmp_path / "spool", batches)
    broker.start()
    ensure_topics(broker.bootstrap)
    spool = Spool(tmp_path / "spool")
    raw = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True})
    after, sent = 0, 0
    while sent < 12 and (rec := spool.read_next(after)) is not None:   # the oldest 12, as the first run sent them
        assert rec.header(RID_HEADER)
        raw.produce(rec.topic, key=rec.key, value=rec.value, headers=rec.headers, timestamp=rec.ts_ms)
        after, sent = rec.seq, sent + 1
    assert raw.flush(10) == 0
    spool.close()

    pub = SpoolingPublisher(broker.bootstrap, tmp_path / "spool")
    try:
        assert pub.flush(20) == 0, pub.stats()
        st = pub.stats()
    finally:
        pub.close()
    assert st["deduplicated"] == 12 and st["replayed"] == batches - 12 and st["acked"] == batches * 50
    events = consume_all(broker.bootstrap, TOPIC)
    assert_exactly_once_in_order(events, Counter({"node-c": batches * 50}))


# --- corrupt records ---------------------------------------------------------------------------------------
def _records(n: int) -> list[SpoolRecord]:
    return [SpoolRecord(i + 1, "telemetry.links", b"node-a", b"[%d]" % i + b"x" * 200,
                        [("ct-schema", b"link_state"), ("ct-count", b"3")], 1_700_000_000_000 + i) for i in range(n)]


def test_truncated_tail_and_flipped_byte_are_skipped_and_counted(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool")
    for rec in _records(10):
        spool.append(rec)
    spool.close()
    (seg,) = sorted((tmp_path / "spool").glob("*.seg"))
    data = bytearray(seg.read_bytes())
    frame = len(encode_frame(_records(1)[0]))
    assert len(data) == 10 * frame
    data[5 * frame - 10] ^= 0x01                       # record 5: one bit flipped in its value (only the CRC sees it)
    seg.write_bytes(bytes(data[:-frame // 2]))        # record 10: cut in half, as a crash mid-write leaves it

    spool = Spool(tmp_path / "spool")
    assert spool.corrupt_records == 2
    assert spool.pending_records == 8 and spool.pending_events == 24
    got, after = [], 0
    while (rec := spool.read_next(after)) is not None:
        got.append(rec.seq)
        after = rec.seq
    assert got == [1, 2, 3, 4, 6, 7, 8, 9]
    assert spool.next_seq == 10
    spool.append(_records(11)[-1])                     # goes to a new segment, never after the torn tail
    assert len(list((tmp_path / "spool").glob("*.seg"))) == 2
    spool.close()

    pub = SpoolingPublisher(f"127.0.0.1:{free_port()}", tmp_path / "spool", probe_timeout_s=0.2)
    try:
        st = pub.stats()
    finally:
        pub.close(timeout=0)
    assert st["corrupt_records"] == 2 and st["spool_records"] == 9 and st["spool_events"] == 27


def test_garbage_between_records_resynchronises(tmp_path: Path) -> None:
    recs = _records(3)
    path = tmp_path / "spool" / "0000000001.seg"
    path.parent.mkdir()
    path.write_bytes(encode_frame(recs[0]) + b"CTSP\x00\x00\x01garbage" + encode_frame(recs[1]) + b"\x00" * 7
                     + encode_frame(recs[2]))
    spool = Spool(tmp_path / "spool")
    assert spool.corrupt_records == 2
    assert [e.seq for e in spool.entries()] == [1, 2, 3]
    spool.close()


def test_ack_removes_segments_and_survives_reopen(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool", max_bytes=1 << 20, segment_bytes=1024)
    for rec in _records(20):
        spool.append(rec)
    segs = len(list((tmp_path / "spool").glob("*.seg")))
    assert segs > 3
    for seq in [2, 1, 3, 5, 4, 6, 7, 8]:                # out of order, as acks across partitions come
        assert spool.ack(seq)
    assert not spool.ack(3), "an acked record is acked once"
    assert spool.cursor == 8 and spool.pending_records == 12
    assert len(list((tmp_path / "spool").glob("*.seg"))) < segs
    spool.ack(10)
    spool.close()
    spool = Spool(tmp_path / "spool", max_bytes=1 << 20, segment_bytes=1024)
    assert [e.seq for e in spool.entries()][:3] == [9, 10, 11]   # 10 comes back: only the cursor is persisted
    assert spool.cursor == 8 and spool.next_seq == 21
    spool.close()


def test_unreachable_broker_is_detected_and_records_spool_in_order(tmp_path: Path) -> None:
    pub = SpoolingPublisher(f"127.0.0.1:{free_port()}", tmp_path / "spool", probe_timeout_s=0.2)
    try:
        for r in range(5):
            pub.publish_batch(link_batch(r))
        assert pub.flush(0.5) == 5
        st = pub.stats()
    finally:
        pub.close(timeout=0)
    assert st["broker_up"] is False and st["spool_records"] == 5 and st["acked"] == 0


def test_a_spool_directory_has_one_writer(tmp_path: Path) -> None:
    from clocktower.producers.spool import SpoolInUse

    first = Spool(tmp_path / "spool")
    with pytest.raises(SpoolInUse, match=f"in use by another publisher \\(pid {os.getpid()}\\)"):
        Spool(tmp_path / "spool")
    first.close()
    Spool(tmp_path / "spool").close()          # free again once closed


def test_a_full_disk_loses_only_the_records_it_refused_and_counts_them(tmp_path: Path, monkeypatch) -> None:
    """A write the disk refuses (ENOSPC, or a short write) leaves no torn frame; the record is counted as
    dropped, and spooling goes on once the disk takes writes again."""
    import errno

    import clocktower.producers.spool as spool_module

    real_write = os.write
    full = {"on": False}

    def write(fd: int, data: bytes) -> int:
        if full["on"]:
            if len(data) > 8:
                real_write(fd, data[:8])          # a short write first: the torn bytes must be cut off
                return 8
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(spool_module.os, "write", write)
    pub = SpoolingPublisher(f"127.0.0.1:{free_port()}", tmp_path / "spool", probe_timeout_s=0.2)
    try:
        for r in range(3):
            pub.publish_batch(link_batch(r))
        full["on"] = True
        for r in range(3, 5):
            pub.publish_batch(link_batch(r))
        full["on"] = False
        for r in range(5, 8):
            pub.publish_batch(link_batch(r))
        st = pub.stats()
    finally:
        pub.close(timeout=0)
    assert st["dropped_records"] == 2 and st["dropped_events"] == 20 and st["spool_records"] == 6
    assert sum(pub.failed.values()) == 20 and st["in_flight"] == 0
    spool = Spool(tmp_path / "spool")
    kept, after = [], 0
    while (rec := spool.read_next(after)) is not None:
        kept.append(decode_batch("telemetry.links", rec.key, rec.value, rec.headers).events[0].carrier_changes // 10)
        after = rec.seq
    assert spool.corrupt_records == 0
    spool.close()
    assert kept == [0, 1, 2, 5, 6, 7]
