"""A Kafka publisher that loses nothing while the broker is away: a local spool, replayed in order.

`SpoolingPublisher` is a KafkaPublisher (same envelope records, compression, idempotence, counters) with a
bounded on-disk spool (`producers.spool.Spool`) in front of the broker:

* Broker up and spool empty: records go straight to librdkafka, as with KafkaPublisher.
* Broker away: every new record is appended to the spool. So are the records librdkafka still holds
  unacknowledged at that moment (they are written first, keeping the order), and any record whose
  delivery later fails. A record leaves the spool only when the broker acknowledged it.
* Broker back: the spool is replayed oldest first (at most `replay_window` records in flight). While
  anything is spooled, new records are appended behind it, so the order per topic and key is kept;
  once the spool is empty the publisher goes back to sending directly.

How "away" is detected:
  - librdkafka's error callback reporting _ALL_BROKERS_DOWN (it fires at once when the connection drops
    or a connect is refused). A lone _TRANSPORT error does not count: on a cluster one broker may go.
  - any delivery failure other than a permanent one (record too large, invalid): librdkafka gives up on
    a record after `message_timeout_ms` (5 s by default, short on purpose) and the record is spooled.
  - at start the broker is presumed away until the first probe answers.
  How "back" is detected: while away, a metadata request (`list_topics`) every `probe_interval_s`; any
  acknowledgement also counts.

Duplicates. A record that reached the broker but whose acknowledgement was lost (the broker stopped
mid-request; or this process died after the ack but before the spool noted it) is "in doubt". Every
record carries a `ct-rid` header, unique per record. Before replaying after an outage, and after a restart
with a non-empty spool, the publisher reads the spooled topics back from the time of the oldest in-doubt
record (offsets_for_times) and does not resend a record whose ct-rid it finds. So replay is exactly-once
as long as that check completes; if it cannot (the broker keeps failing it, or more than
`dedup_scan_limit` records would have to be read) it is skipped with a warning, and a record may then be
delivered twice. The order per partition also relies on librdkafka's idempotent producer, which keeps
retrying a partition's records in order.

An ack is not always durable: the embedded broker acknowledges before it writes, and a kill -9 loses about
the last second of acked records (more as its log grows). So every acked record is also held in memory for
`ack_hold_s` (producers/ack_hold.py). If the broker goes away within that time, the held records go back to
the spool as in doubt, and the read-back above resends only those Kafka no longer has (after the records
already queued: their order relative to newer records is not kept).

What can still be lost: a crash of this process while records sit only in librdkafka's memory (sent
directly and not yet acknowledged, at most `message_timeout_ms` of traffic while the broker is up), records
a broker loses more than `ack_hold_s` after acking them, or while this publisher is stopped, and,
on a machine crash, the last `fsync_interval_s` of spooled records (see producers/spool.py). When the
spool is full the oldest segments are dropped, counted (records and events) and logged.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from clocktower.producers.ack_hold import AckHold
from clocktower.producers.kafka_publisher import KafkaPublisher, check_topic
from clocktower.producers.lost_acks import ReleasedAcks, read_rids
from clocktower.producers.spool import Spool, SpoolEntry, SpoolRecord
from clocktower.producers.spool_resplit import part_rid, resplit
from clocktower.runtime.broker_profile import LIBRDKAFKA_MAX_RESPONSE_BYTES
from clocktower.schemas.batch_split import EncodedRecord
from clocktower.schemas.codec import DecodeError
from clocktower.schemas.kafka_security import KafkaSecurity

log = logging.getLogger(__name__)

RID_HEADER = "ct-rid"
DEFAULT_MAX_SPOOL_BYTES = 256 * 1024 * 1024
_PERMANENT = {KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.INVALID_RECORD, KafkaError.INVALID_MSG,
              KafkaError.RECORD_LIST_TOO_LARGE, KafkaError.INVALID_MSG_SIZE,
              KafkaError.TOPIC_AUTHORIZATION_FAILED}

DeliveryCallback = Callable[[KafkaError | None, Any], None]


class _Pending:
    """A record handed to librdkafka and not yet resolved."""

    __slots__ = ("rec", "on_disk", "replay", "orphan", "part")

    def __init__(self, rec: SpoolRecord, on_disk: bool, replay: bool, part: tuple[int, int] | None = None) -> None:
        self.rec = rec
        self.on_disk = on_disk        # also in the spool (sent from it, or written there while in flight)
        self.replay = replay          # sent from the spool by the replayer
        self.orphan = False           # its spool segment was dropped (spool full) while it was in flight
        self.part = part              # (seq of the spooled record it was cut from, part index): see _Split


@dataclass
class _Split:
    """A spooled record over today's record limit, sent as parts (producers/spool_resplit.py).

    It stays in the spool until every part is resolved (acknowledged, found in Kafka, or refused for good), so
    a crash or an outage meanwhile replays it: it is cut again and only the unresolved parts are sent."""

    parent: SpoolRecord
    part_events: list[int]                                                   # events per part, in order
    ok: bool = True                                                          # no part rejected, no event refused
    resolved: set[int] = field(default_factory=set)
    waiting: deque[tuple[int, SpoolRecord]] = field(default_factory=deque)   # this round's parts not yet handed over
    seqs: dict[int, int] = field(default_factory=dict)                       # part index -> its seq this round
    recounted: set[int] = field(default_factory=set)   # acked, then in doubt again (broker went away): counted once


class SpoolingPublisher(KafkaPublisher):
    """KafkaPublisher with a bounded on-disk spool for the times the broker is unreachable."""

    def __init__(self, bootstrap: str, spool_dir: str | Path, max_spool_bytes: int = DEFAULT_MAX_SPOOL_BYTES,
                 compression: str = "lz4", max_events_per_record: int = 1000, *,
                 message_timeout_ms: int = 5000, probe_interval_s: float = 0.5, probe_timeout_s: float = 1.0,
                 fsync_interval_s: float = 1.0, replay_window: int = 500, dedup_scan_limit: int = 1_000_000,
                 segment_bytes: int | None = None, extra_config: dict[str, object] | None = None,
                 ack_hold_s: float = 5.0) -> None:
        if compression not in ("lz4", "zstd"):
            raise ValueError(f"compression must be lz4 or zstd, not {compression!r}")
        self._lock = threading.RLock()
        self.bootstrap = bootstrap
        self.spool = Spool(spool_dir, max_spool_bytes, segment_bytes)
        self._released = ReleasedAcks()            # let go by the hold: counted if the broker loses them
        self._hold = AckHold(ack_hold_s, on_release=self._on_release)
        try:
            self._init(bootstrap, max_events_per_record, compression, message_timeout_ms, probe_interval_s,
                       probe_timeout_s, fsync_interval_s, replay_window, dedup_scan_limit, extra_config)
        except BaseException:
            self.spool.close()                     # release the spool's lock: a retry must be able to open it
            raise

    def _init(self, bootstrap: str, max_events_per_record: int, compression: str, message_timeout_ms: int,
              probe_interval_s: float, probe_timeout_s: float, fsync_interval_s: float, replay_window: int,
              dedup_scan_limit: int, extra_config: dict[str, object] | None) -> None:
        self._compression = compression
        self._extra: dict[str, object] = {
            "message.timeout.ms": message_timeout_ms,
            "reconnect.backoff.ms": 100,
            "reconnect.backoff.max.ms": 1000,
            "error_cb": self._on_error,
            **(extra_config or {}),
        }
        super().__init__(bootstrap, max_events_per_record, compression, self._extra)
        self.probe_interval_s = probe_interval_s
        self.probe_timeout_s = probe_timeout_s
        self.fsync_interval_s = fsync_interval_s
        self.replay_window = replay_window
        self.dedup_scan_limit = dedup_scan_limit
        self._recounted: set[int] = set()          # spooled again after their ack: not counted twice

        self._instance = uuid.uuid4().hex[:16]     # with the seq, makes each record's ct-rid unique
        self._seq = self.spool.next_seq
        self._inflight: dict[int, _Pending] = {}
        self._callbacks: dict[int, DeliveryCallback] = {}
        self._broker_up = False                    # presumed away until the first probe answers
        self._next_probe = 0.0
        self._replay_after: int | None = None      # replay round in progress: last seq taken from the spool
        self._present: set[bytes] = set()          # ct-rids of spooled records found already in Kafka (this round)
        self._matched: set[bytes] = set()          # those of them already skipped and counted this round
        self._scan_failures = 0
        self._fatal: str | None = None
        self._closing = False
        self._closed = False
        restored = self.spool.entries()
        self._doubt_since: int | None = min((e.ts_ms for e in restored), default=None)
        self._doubt_topics: set[str] = {e.topic for e in restored}
        if restored:
            log.warning("spool %s holds %d records (%d events) from an earlier run; they will be replayed",
                        self.spool.dir, len(restored), sum(e.events for e in restored))

        self.acked_records = 0
        self.spooled_records = 0
        self.spooled_events = 0
        self.replayed_records = 0
        self.deduplicated_records = 0
        self.dropped_records = 0
        self.dropped_events = 0
        self.rejected_records = 0
        self.respooled_records = 0                 # acked, then back to the spool when the broker went away
        self.acked_lost_records = 0                # acked, let go by the hold, then lost by the broker (lost_acks.py)
        self.acked_lost_events = 0
        self._lost_check_failures = 0
        self._went_away: float | None = None       # when the broker went away: the lost-ack check is due
        self._outages = 0                          # times it went away: one during a check leaves the next due
        self._next_lost_check = 0.0                # the pump's retries of a failed check wait like the probe's
        self.resplit_records = 0                   # spooled over today's record limit, sent cut into parts
        self.refused_spooled: Counter[str] = Counter()   # their events too big for a record alone (apart from
        # `refused`, which counts what publish() refuses: the agent subtracts that from what it delivered)
        self._splits: dict[int, _Split] = {}       # by the spooled record's seq
        self._feeding: _Split | None = None        # the split whose parts the replayer is handing over

        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._pump, name="spool-pump", daemon=True)
        self._thread.start()

    # --- publishing ---------------------------------------------------------------
    def send_record(self, topic: str, schema: str, rec: EncodedRecord) -> None:
        """Queue one encoded record of a batch (KafkaPublisher.publish_batch splits a batch too big for one)."""
        self.publish_raw(topic, *self.signed(topic, rec.key, rec.value, rec.headers))
        with self._lock:
            self.sent[schema] += rec.events

    def publish_raw(self, topic: str, key: bytes | None, value: bytes, headers: list | None = None,
                    on_delivery: DeliveryCallback | None = None) -> None:
        """Queue one already-encoded record: to the broker, or behind the spool.

        `on_delivery`, if given, is called once with (None, message) when the broker acknowledges the record,
        or with an error when it is rejected or dropped from a full spool; it does not survive a restart.
        A value over `max_record_bytes` is rejected at once (MSG_SIZE_TOO_LARGE to `on_delivery`): consumers
        refuse it, and cutting spooled records into parts is only for spools written under the old limit."""
        check_topic(topic)
        with self._lock:
            if self._closed:
                raise RuntimeError("publish on a closed SpoolingPublisher")
            if len(value) > self.max_record_bytes:
                self._reject_oversized(topic, value, headers or [], on_delivery)
                return
            seq = self._seq
            self._seq += 1
            rid = f"{self._instance}-{seq}".encode()
            rec = SpoolRecord(seq, topic, key, value, [*(headers or []), (RID_HEADER, rid)], int(time.time() * 1000))
            if on_delivery is not None:
                self._callbacks[seq] = on_delivery
            if self._broker_up and self.spool.pending_records == 0 and self._produce(rec, on_disk=False):
                return
            self._to_spool(rec)

    def _reject_oversized(self, topic: str, value: bytes, headers: list, on_delivery: DeliveryCallback | None) -> None:
        rec = SpoolRecord(-1, topic, None, value, headers, 0)     # for its schema and event count
        msg = (f"refused a {rec.schema} record for {topic} of {len(value)} bytes: over the record limit of "
               f"{self.max_record_bytes} (publish() cuts batches to fit; a raw record must fit on its own)")
        self.rejected_records += 1
        self.failed[rec.schema] += rec.events
        self.errors.append(msg)
        log.error("%s", msg)
        if on_delivery is not None:
            on_delivery(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, msg), None)

    def _produce(self, rec: SpoolRecord, on_disk: bool, replay: bool = False,
                 part: tuple[int, int] | None = None) -> bool:
        """Hand `rec` to librdkafka; False when its queue is full (the caller spools or waits instead)."""
        try:
            self.producer.produce(rec.topic, key=rec.key, value=rec.value, headers=rec.headers,
                                  timestamp=rec.ts_ms, on_delivery=partial(self._on_delivery, rec.seq))
        except BufferError:
            return False
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if isinstance(err, KafkaError) and err.code() in _PERMANENT:   # e.g. over message.max.bytes: it would
                self._inflight[rec.seq] = _Pending(rec, on_disk, replay, part)   # block the spool; rejected for good,
                self._on_delivery(rec.seq, err, None)                        # as a broker refusal is
                return True
            log.warning("cannot hand record %d for %s to librdkafka: %s", rec.seq, rec.topic, exc)
            return False
        self._inflight[rec.seq] = _Pending(rec, on_disk, replay, part)
        return True

    def _to_spool(self, rec: SpoolRecord) -> None:
        self._spill_memory()          # what librdkafka holds only in memory is older: it goes first
        self._append(rec)

    def _append(self, rec: SpoolRecord) -> bool:
        """Spool `rec`; False if the disk refused it (full, I/O error): then it is counted as dropped."""
        try:
            dropped = self.spool.append(rec)
        except OSError as exc:
            self.dropped_records += 1
            self.dropped_events += rec.events
            log.error("cannot write to the spool %s (%s): a record of %d %s events is lost; %d records "
                      "(%d events) dropped so far", self.spool.dir, exc, rec.events, rec.schema,
                      self.dropped_records, self.dropped_events)
            self._final(rec.seq, rec.schema, rec.events, KafkaError(KafkaError._FS, f"spool write failed: {exc}"))
            return False
        self.spooled_records += 1
        self.spooled_events += rec.events
        if dropped:
            self._count_dropped(dropped)
        return True

    def _spill_memory(self) -> None:
        for p in sorted((p for p in self._inflight.values() if not p.on_disk and not p.orphan),
                        key=lambda p: p.rec.seq):
            if self._append(p.rec):
                p.on_disk = True
            else:
                p.orphan = True        # not on disk: if its delivery fails too, it is gone (counted above)

    def _count_dropped(self, entries: list[SpoolEntry]) -> None:
        records = events = 0
        for e in entries:
            if e.seq in self._splits:  # its parts in flight count when they resolve; the others are lost now
                lost = self._drop_split(e.seq)
                records += lost > 0
                events += lost
                self.failed[e.schema] += lost
                cb = self._callbacks.pop(e.seq, None)
                if cb is not None:     # not all its parts will reach Kafka (any acked ones did)
                    cb(KafkaError(KafkaError._QUEUE_FULL, "dropped: spool full (sent in parts, not all went)"), None)
                continue
            p = self._inflight.get(e.seq)
            if p is not None:          # on its way: it counts as dropped only if its delivery fails
                p.on_disk, p.orphan = False, True
                continue
            records += 1
            events += e.events
            self._final(e.seq, e.schema, e.events, KafkaError(KafkaError._QUEUE_FULL, "dropped: spool full"))
        self.dropped_records += records
        self.dropped_events += events
        if records:
            log.warning("spool full (%d bytes max): dropped the oldest %d records (%d events); %d records "
                        "(%d events) dropped so far", self.spool.max_bytes, records, events,
                        self.dropped_records, self.dropped_events)

    def _final(self, seq: int, schema: str, events: int, err: KafkaError) -> None:
        """A record is gone for good (dropped or rejected)."""
        self.failed[schema] += events
        cb = self._callbacks.pop(seq, None)
        if cb is not None:
            cb(err, None)

    # --- librdkafka callbacks (served by poll, on the pump thread or in flush) ------------
    def _on_delivery(self, seq: int, err: KafkaError | None, msg: Any) -> None:
        with self._lock:
            p = self._inflight.pop(seq, None)
            if p is None:
                return
            rec = p.rec
            if err is None:
                self._broker_up = True
                if seq in self._recounted:
                    self._recounted.discard(seq)
                else:
                    self.acked[rec.schema] += rec.events
                    self.acked_records += 1
                where = (msg.partition(), msg.offset()) if msg is not None else (-1, -1)   # (tests pass None)
                self._hold.hold(rec, time.monotonic(), *where)
                if p.part is not None:
                    self._part_resolved(*p.part, ok=True)
                elif p.on_disk:
                    self.spool.ack(seq)
                if p.replay:
                    self.replayed_records += 1
                cb = self._callbacks.pop(seq, None)
                if cb is not None:
                    cb(None, msg)
                return
            if self._closing:                       # purged at close: it is on disk already
                return
            if err.code() in _PERMANENT:
                self.rejected_records += 1
                self.errors.append(str(err))
                log.error("broker rejected a record of %d %s events for %s: %s", rec.events, rec.schema,
                          rec.topic, err)
                if p.part is not None:
                    self._part_resolved(*p.part, ok=False)
                elif p.on_disk:
                    self.spool.ack(seq)
                self._final(seq, rec.schema, rec.events, err)
                return
            if p.orphan:
                self.dropped_records += 1
                self.dropped_events += rec.events
                log.warning("a record of %d %s events dropped from the full spool failed delivery (%s): lost",
                            rec.events, rec.schema, err)
                self._final(seq, rec.schema, rec.events, err)
                return
            self._doubt_since = rec.ts_ms if self._doubt_since is None else min(self._doubt_since, rec.ts_ms)
            self._doubt_topics.add(rec.topic)
            if not p.on_disk:
                self._inflight[seq] = p             # spilled in order with the others still in memory
            try:
                self._go_down(f"delivery failed: {err.str()}")
            finally:
                self._inflight.pop(seq, None)

    def _on_error(self, err: KafkaError) -> None:
        if err.fatal():
            log.error("librdkafka fatal error: %s; the producer will be recreated", err)
            with self._lock:
                self._fatal = str(err)
                self._go_down(f"fatal: {err.str()}")
        elif err.code() == KafkaError._ALL_BROKERS_DOWN:
            with self._lock:
                self._go_down(err.str())
        else:
            log.debug("librdkafka: %s", err)

    def _go_down(self, reason: str) -> None:
        if self._broker_up:
            log.warning("Kafka broker unreachable (%s): spooling to %s", reason, self.spool.dir)
        self._outages += 1
        if self._went_away is None:
            self._went_away = time.monotonic()
        self._broker_up = False
        self._replay_after = None
        self._feeding = None                 # the next round cuts it again and sends the parts not resolved
        self._next_probe = time.monotonic() + self.probe_interval_s
        if not self._closing:
            self._spill_memory()
            self._respool_held()

    def _respool_held(self) -> None:
        """Acked records still held go back to the spool, in doubt: resent only if Kafka lost them.

        A held part of a record still being sent as parts is not spooled again: it becomes unresolved, and its
        parent (still spooled) covers it; a copy with the same ct-rid would be sent again after a restart."""
        held = self._hold.take_all()
        parts = {seq: (parent, i) for parent, split in self._splits.items() for i, seq in split.seqs.items()}
        for old in held:
            if (part := parts.get(old.seq)) is not None and part[1] in self._splits[part[0]].resolved:
                split = self._splits[part[0]]
                split.resolved.discard(part[1])
                split.recounted.add(part[1])
                self.respooled_records += 1
                self._doubt_since = old.ts_ms if self._doubt_since is None else min(self._doubt_since, old.ts_ms)
                self._doubt_topics.add(old.topic)
                continue
            rec = SpoolRecord(self._seq, old.topic, old.key, old.value, old.headers, old.ts_ms)  # same ct-rid
            self._seq += 1
            if self._append(rec):
                self._recounted.add(rec.seq)
                self.respooled_records += 1
                self._doubt_since = rec.ts_ms if self._doubt_since is None else min(self._doubt_since, rec.ts_ms)
                self._doubt_topics.add(rec.topic)
        if held:
            log.warning("%d records acknowledged in the last %.0f s are spooled again until Kafka shows it "
                        "still has them", len(held), self._hold.hold_s)

    # --- the pump: probe, replay, fsync ---------------------------------------------------
    def _pump(self) -> None:
        next_sync = time.monotonic() + self.fsync_interval_s
        while not self._stop.is_set():
            try:
                self._poll(0.05)
                if self._fatal is not None:
                    self._recreate_producer()
                now = time.monotonic()
                with self._lock:
                    self._hold.release(now)
                if now >= next_sync:
                    with self._lock:
                        self.spool.sync()
                    next_sync = now + self.fsync_interval_s
                if not self._broker_up:
                    if now >= self._next_probe:
                        self._probe()
                    continue
                due = self._went_away is not None and now >= self._next_lost_check   # an ack saw it back first
                if due and not self._count_lost_acks():
                    self._next_lost_check = time.monotonic() + self.probe_interval_s
                self._replay_step()
            except Exception:  # the pump must keep going; the spool holds the records meanwhile
                log.exception("spool pump error")
                time.sleep(0.5)

    def _poll(self, timeout: float) -> bool:
        """Serve librdkafka's callbacks; False when the producer hit a fatal error (the pump then recreates it).

        A fatal error can come out of poll itself: the idempotent producer's OUT_OF_ORDER_SEQUENCE_NUMBER after
        a broker restarted having lost records it had acknowledged (its sequence state went back in time)."""
        try:
            self.producer.poll(timeout)
            return True
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if not (isinstance(err, KafkaError) and err.fatal()):
                raise
            with self._lock:
                if self._fatal is None:
                    log.error("librdkafka fatal error: %s; the producer will be recreated", err.str())
                    self._fatal = err.str()
                    self._go_down(f"fatal: {err.str()}")
            return False

    def _on_release(self, rec: SpoolRecord, partition: int, offset: int) -> None:
        self._released.released(rec.topic, partition, offset, rec.header(RID_HEADER), rec.events)

    def _probe(self) -> None:
        try:
            self.producer.list_topics(timeout=self.probe_timeout_s)
            if not self._count_lost_acks():
                raise KafkaException("read-back of the acked records not held failed")
        except KafkaException:
            with self._lock:
                self._next_probe = time.monotonic() + self.probe_interval_s
            return
        with self._lock:
            if not self._broker_up:
                if self.spool.pending_records:
                    log.info("Kafka broker reachable: replaying %d spooled records (%d events)",
                             self.spool.pending_records, self.spool.pending_events)
                self._broker_up = True

    def _recreate_producer(self) -> None:
        with self._lock:
            old, self._fatal = self.producer, None
            self.producer = KafkaPublisher(self.bootstrap, self.max_events, self._compression, self._extra).producer
        with contextlib.suppress(KafkaException):
            old.purge()
            old.flush(0)           # purged records fail into the spool (they are on disk already)

    def _replay_step(self) -> None:
        with self._lock:
            if self.spool.pending_records == 0:
                self._replay_after = None
                self._present, self._matched = set(), set()
                return
            start_round = self._replay_after is None
            if start_round and self._inflight:   # earlier sends resolve first (acked, or back to the spool)
                return
            doubt = (self._doubt_since, set(self._doubt_topics)) if self._doubt_since is not None else None
        if start_round:
            present: set[bytes] = set()
            if doubt is not None:
                try:
                    present = self._find_present(doubt[1], doubt[0])
                except Exception as exc:
                    self._scan_failures += 1
                    if self._scan_failures < 3:
                        log.warning("cannot check which spooled records Kafka already has (%s); will retry", exc)
                        with self._lock:
                            self._go_down(f"check failed: {exc}")
                        return
                    log.warning("cannot check which spooled records Kafka already has (%s): replaying all; "
                                "records sent just before the outage may be duplicated", exc)
            with self._lock:
                if self._replay_after is not None or not self._broker_up or self._inflight:
                    return
                self._present, self._matched = present, set()
                self._scan_failures = 0
                if doubt is not None and self._doubt_since == doubt[0]:
                    self._doubt_since, self._doubt_topics = None, set()
                self._replay_after = self.spool.cursor
        with self._lock:
            if self._replay_after is None:
                return
            budget = self.replay_window - len(self._inflight)
            while budget > 0:
                if self._feeding is not None:            # parts of a cut record go before anything spooled later
                    budget -= self._feed_parts(budget)
                    if self._feeding is not None:
                        break
                    continue
                rec = self.spool.read_next(self._replay_after, skip=self._inflight)
                if rec is None:
                    break
                rid = rec.header(RID_HEADER)
                if rid is not None and rid in self._present:    # it reached Kafka before: do not resend
                    self._replay_after = rec.seq     # (kept in _present: a second copy of it is redundant too)
                    self.spool.ack(rec.seq)
                    self.deduplicated_records += 1
                    if rec.seq in self._recounted or rid in self._matched:
                        self._recounted.discard(rec.seq)
                    else:
                        self.acked[rec.schema] += rec.events
                        self.acked_records += 1
                    self._matched.add(rid)
                    continue
                if len(rec.value) > self.max_record_bytes:   # spooled under the old, larger limit: cut it
                    self._replay_after = rec.seq
                    self._start_split(rec)
                    continue
                if not self._produce(rec, on_disk=True, replay=True):
                    break
                self._replay_after = rec.seq
                budget -= 1

    # --- records spooled over today's record limit (called with the lock held) ---------------------------
    def _start_split(self, rec: SpoolRecord) -> None:
        """Queue the parts of `rec` not yet resolved (self._feeding); reject it if it is not a record of ours."""
        split = self._splits.get(rec.seq)
        try:
            cut = resplit(rec, self.max_record_bytes)
        except DecodeError as exc:
            self.rejected_records += 1
            msg = (f"spooled record {rec.seq} for {rec.topic} ({len(rec.value)} bytes, over the record limit of "
                   f"{self.max_record_bytes}) does not decode, so it cannot be cut into parts: rejected ({exc})")
            self.errors.append(msg)
            log.error("%s", msg)
            self.spool.ack(rec.seq)
            self._final(rec.seq, rec.schema, rec.events, KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, msg))
            return
        if split is None:                       # first cut: count and log what no record can hold
            split = self._splits[rec.seq] = _Split(rec, [part.events for part in cut.parts], ok=not cut.refused)
            self.resplit_records += 1
            for event, size in cut.refused:
                self.refused_spooled[cut.schema] += 1
                msg = (f"refused a {cut.schema} event of node {event.node!r} at ts_ns {event.ts_ns} from the spool: "
                       f"{size} bytes encoded, more than a record holds ({self.max_record_bytes})")
                self.errors.append(msg)
                log.error("%s", msg)
            log.warning("spooled record %d for %s holds %d bytes, over the record limit of %d: sent as %d records",
                        rec.seq, rec.topic, len(rec.value), self.max_record_bytes, len(cut.parts))
        parent_rid = rec.header(RID_HEADER) or f"{self._instance}-{rec.seq}".encode()
        split.waiting.clear()
        for i, part in enumerate(cut.parts):
            if i in split.resolved:
                continue
            rid = part_rid(parent_rid, i)
            if rid in self._present:                 # it reached Kafka before: not resent
                self.deduplicated_records += 1
                if i not in split.recounted and rid not in self._matched:
                    self.acked[cut.schema] += part.events
                    self.acked_records += 1
                self._matched.add(rid)
                split.resolved.add(i)
                continue
            key, value, headers = self.signed(rec.topic, part.key, part.value, part.headers)
            seq, self._seq = self._seq, self._seq + 1
            split.seqs[i] = seq
            if i in split.recounted:
                self._recounted.add(seq)
            split.waiting.append((i, SpoolRecord(seq, rec.topic, key, value, [*headers, (RID_HEADER, rid)],
                                                 rec.ts_ms)))
        self._feeding = split
        self._check_split_done(split)

    def _feed_parts(self, budget: int) -> int:
        """Hand up to `budget` waiting parts to librdkafka, in order; returns how many."""
        split, sent = self._feeding, 0
        assert split is not None
        while split.waiting and sent < budget:
            i, part = split.waiting[0]
            if not self._produce(part, on_disk=True, replay=True, part=(split.parent.seq, i)):
                return sent
            split.waiting.popleft()
            sent += 1
        if not split.waiting:
            self._feeding = None
        return sent

    def _part_resolved(self, parent: int, index: int, ok: bool) -> None:
        split = self._splits.get(parent)
        if split is not None:
            split.resolved.add(index)
            split.ok = split.ok and ok
            self._check_split_done(split)

    def _check_split_done(self, split: _Split) -> None:
        """Every part resolved: the spooled record is done (its callback, if any, told whether all went)."""
        if len(split.resolved) < len(split.part_events):
            return
        seq = split.parent.seq
        del self._splits[seq]
        if self._feeding is split:
            self._feeding = None
        self.spool.ack(seq)
        self._recounted.discard(seq)
        cb = self._callbacks.pop(seq, None)
        if cb is not None:
            cb(None if split.ok else KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "sent in parts, not all accepted"),
               None)

    def _drop_split(self, parent: int) -> int:
        """The spool dropped a record being sent as parts: events lost now (parts neither resolved nor in flight).

        Parts in flight become orphans: acked, they count as acked; failed, as dropped."""
        split = self._splits.pop(parent)
        if self._feeding is split:
            self._feeding = None
        lost = 0
        for i, events in enumerate(split.part_events):
            p = self._inflight.get(split.seqs.get(i, -1))
            if p is not None and p.part == (parent, i):
                p.part, p.on_disk, p.orphan = None, False, True
            elif i not in split.resolved:
                lost += events
        return lost

    def _count_lost_acks(self) -> bool:
        """Once the broker is back (before the probe says so, or in the pump when an ack said so first): read again
        where the records the hold let go of landed, and count those no longer there (producers/lost_acks.py).
        False if that read failed (the probe is tried again), at most twice; the third failure gives up with a
        warning. Blocks the pump while it reads (bounded by read_rids' timeout)."""
        with self._lock:
            went_away, outages = self._went_away, self._outages
            if went_away is None:
                return True
            checked, first = self._released.to_check(went_away)
        found: dict = {}
        deleted_below: dict = {}    # where the broker deleted records read by all (clocktower/log_trim.py): arrived
        if first:
            try:
                consumer = self._readback_consumer()
                try:
                    found = read_rids(consumer, first, RID_HEADER, self.dedup_scan_limit,
                                      deleted_below=deleted_below)
                finally:
                    consumer.close()
            except Exception as exc:  # noqa: BLE001 - the broker may not be ready yet: the next probe tries again
                self._lost_check_failures += 1
                if self._lost_check_failures < 3:
                    return False
                log.warning("cannot tell whether the broker lost acknowledged records that were no longer held "
                            "(%s)", exc)
        self._lost_check_failures = 0
        with self._lock:
            if self._outages == outages:        # else it went away again meanwhile: that outage is checked next
                self._went_away = None
            lost = self._released.lost(checked, found, deleted_below)
            self.acked_lost_records += len(lost)
            self.acked_lost_events += sum(r.events for r in lost)
        if lost:
            log.error("the broker lost %d records (%d events) it had acknowledged more than %.0f s before it went "
                      "away (past the ack hold): they cannot be resent; %d lost so far (acked_lost_records)",
                      len(lost), sum(r.events for r in lost), self._hold.hold_s, self.acked_lost_records)
        return True

    def _readback_consumer(self) -> Consumer:
        return Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"clocktower-spool-{self._instance}",
                         "enable.auto.commit": False, "enable.partition.eof": True, "fetch.wait.max.ms": 50,
                         # an offset the broker deleted under the read (clocktower/log_trim.py): go on from the
                         # log's start, not its end (read_rids notes where that is)
                         "auto.offset.reset": "earliest",
                         "log.connection.close": False,
                         # a read-back under a flood of 100+ MB: the embedded broker answers it in one response
                         "receive.message.max.bytes": LIBRDKAFKA_MAX_RESPONSE_BYTES,
                         **KafkaSecurity().librdkafka()})

    def _find_present(self, topics: Iterable[str], since_ms: int) -> set[bytes]:
        """The ct-rids in `topics` from `since_ms` (less a second) on: what already reached Kafka."""
        consumer = self._readback_consumer()
        try:
            meta = consumer.list_topics(timeout=5)
            wanted = [TopicPartition(t, p, since_ms - 1000) for t in sorted(topics)
                      if (tm := meta.topics.get(t)) is not None and tm.error is None for p in sorted(tm.partitions)]
            if not wanted:
                return set()
            first: dict[tuple[str, int], int] = {}
            for tp in consumer.offsets_for_times(wanted, timeout=10):
                if tp.error is not None:
                    raise KafkaException(tp.error)
                if tp.offset >= 0:               # -1: nothing at or after since_ms in this partition
                    first[(tp.topic, tp.partition)] = tp.offset
            found = read_rids(consumer, first, RID_HEADER, self.dedup_scan_limit)
            return {rid for rids in found.values() for rid in rids.values() if rid is not None}
        finally:
            consumer.close()

    # --- flush, close, stats --------------------------------------------------------------
    def _outstanding(self) -> int:
        return self.spool.pending_records + sum(1 for p in self._inflight.values() if not p.on_disk)

    def flush(self, timeout: float = 30.0) -> int:
        """Wait until everything published (spool included) is acknowledged; returns the records still
        outstanding (spooled or in flight) when `timeout` ran out. The spool is fsynced either way."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                left = self._outstanding()
            if left == 0 or time.monotonic() >= deadline:
                break
            if not self._poll(0.05):
                time.sleep(0.05)               # the pump is recreating the producer
        with self._lock:
            self.spool.sync()
        return left

    def close(self, timeout: float = 5.0) -> int:
        """Deliver what can be delivered within `timeout`, spool the rest, and stop; returns records left in the
        spool (a later SpoolingPublisher on the same spool_dir replays them)."""
        if self._closed:
            return self.spool.pending_records
        if timeout > 0:
            self.flush(timeout)
        self._stop.set()
        self._thread.join(max(timeout, 0) + 30.0)  # a read-back scan in progress can take a while
        if self._thread.is_alive():
            log.warning("the spool pump thread did not stop within %.0f s; closing anyway", timeout + 30.0)
        with self._lock:
            self._spill_memory()
            self._closing = True
            self._closed = True
        self.producer.purge()
        self.producer.flush(0)
        with self._lock:
            self.spool.close()
            left = self.spool.pending_records
        if left:
            log.warning("closing with %d records (%d events) in the spool %s", left, self.spool.pending_events,
                        self.spool.dir)
        return left

    def __enter__(self) -> SpoolingPublisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def broker_up(self) -> bool:
        return self._broker_up

    def stats(self) -> dict[str, int | bool]:
        """Counters since this object was made, and the spool's state now.

        acked: events the broker acknowledged (replayed and deduplicated ones included); acked_records: records.
        spooled / spooled_events: records (events) written to the spool. replayed: records sent from the spool
        and acknowledged. deduplicated: spooled records found already in Kafka and so not resent.
        held: acked records held for ack_hold_s; respooled: acked records spooled again because the broker
        went away within ack_hold_s (resent only if Kafka lost them; acked counts them once).
        acked_lost_records / acked_lost_events: acked, let go by the hold, and found missing when the broker came
        back (it lost them after ack_hold_s: not resent; producers/lost_acks.py).
        dropped_events / dropped_records: lost to a full spool. rejected_records: refused for good (by the broker:
        too large, invalid; or by publish_raw: over max_record_bytes). resplit_records: spooled records over
        today's record limit (from before it), sent cut into parts. refused: events too big for a record on
        their own, never sent (by publish, as KafkaPublisher.refused, or cut from the spool).
        corrupt_records: spool frames that failed their checksum and were skipped.
        spool_bytes / spool_records / spool_events: what the spool holds now. broker_up: the current verdict.
        """
        with self._lock:
            return {
                "acked": sum(self.acked.values()),
                "acked_records": self.acked_records,
                "spooled": self.spooled_records,
                "spooled_events": self.spooled_events,
                "replayed": self.replayed_records,
                "deduplicated": self.deduplicated_records,
                "dropped_events": self.dropped_events,
                "dropped_records": self.dropped_records,
                "rejected_records": self.rejected_records,
                "corrupt_records": self.spool.corrupt_records,
                "spool_bytes": self.spool.bytes,
                "spool_records": self.spool.pending_records,
                "spool_events": self.spool.pending_events,
                "in_flight": len(self._inflight),
                "held": len(self._hold),
                "respooled": self.respooled_records,
                "acked_lost_records": self.acked_lost_records,
                "acked_lost_events": self.acked_lost_events,
                "resplit_records": self.resplit_records,
                "refused": sum(self.refused.values()) + sum(self.refused_spooled.values()),
                "broker_up": self._broker_up,
            }

