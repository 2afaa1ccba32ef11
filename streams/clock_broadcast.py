"""Every worker's copy of the clock estimates: a reader of all of analytics.clock, outside the group.

The flow join on every worker corrects latencies with every node's clock, but one worker solves them
(streams/joins/clock_solve.py). faust-streaming's GlobalTable did not update live across two workers on
this broker (measured; faust-streaming#283 reports the same), so each worker runs this plain consumer:
no group, every partition assigned, starting a bounded number of records back (the view keeps only the
latest estimates per node), on its own thread. The view is read under a lock by the join.

The embedded broker answers every fetch at once, ignoring `fetch.wait.max.ms`, and librdkafka fetches in
its own broker thread whether or not we consume: an assigned, unpaused partition makes that thread spin
(about half a core, and the broker with it). So the consumer holds no assignment while idle: every
`idle_backoff_s` the thread asks for the partitions' high watermarks, assigns only those with records past
what it has read (at its own next offsets), reads up to that mark (or until nothing more comes) and drops
the assignment again. An estimate waits at most that long. (Not pause/resume: librdkafka's broker thread
noticed a resume only 0.5-0.7 s later, measured; an assign starts its fetch at once.)
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from clocktower.schemas.analytics import ClockEstimate
from clocktower.schemas.codec import DecodeError, decode_batch
from clocktower.streams.clocksync.clock_view import ClockView

log = logging.getLogger(__name__)
TOPIC = "analytics.clock"
IDLE_BACKOFF_S = 0.25   # how often an idle reader looks for new estimates
READ_WAIT_S = 0.5       # an assigned partition that brings nothing for this long is dropped again


class ClockBroadcast:
    """ClockCorrection for the flow join, fed from analytics.clock."""

    def __init__(self, bootstrap: str, security: dict[str, str], lookback_records: int = 20_000,
                 idle_backoff_s: float = IDLE_BACKOFF_S) -> None:
        self.view = ClockView()
        self.lookback_records = lookback_records
        self.idle_backoff_s = idle_backoff_s
        self._conf: dict[str, Any] = {"bootstrap.servers": bootstrap, "group.id": "clocktower-clock-broadcast",
                                      "auto.offset.reset": "earliest",   # an offset past retention: the oldest kept
                                      "enable.auto.commit": False, "fetch.wait.max.ms": 100, **security}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.estimates = 0
        self.errors = 0

    def to_reference(self, node: str, local_ns: int) -> tuple[int, int] | None:
        with self._lock:
            return self.view.to_reference(node, local_ns)

    def awaits(self, node: str, local_ns: int) -> bool:
        with self._lock:
            return self.view.awaits(node, local_ns)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="clock-broadcast", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _start_offsets(self, consumer: Consumer) -> dict[int, int]:
        """Partition -> where to start reading, `lookback_records` back, for every partition of TOPIC."""
        meta = consumer.list_topics(timeout=10)   # every topic: a request naming one auto-creates it here
        topic = meta.topics.get(TOPIC)
        if topic is None or topic.error is not None or not topic.partitions:
            raise RuntimeError(f"{TOPIC} has no partitions yet")
        starts = {}
        for p in sorted(topic.partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=10)
            starts[p] = max(low, high - self.lookback_records)
        return starts

    def _behind(self, consumer: Consumer, next_offsets: dict[int, int]) -> dict[int, int]:
        """Partition -> high watermark, for each partition with records past `next_offsets` (one query each).
        A partition whose mark fell below what was read (the topic re-created) starts again `lookback_records` back."""
        behind = {}
        for p, next_offset in next_offsets.items():
            marks = consumer.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=5, cached=False)
            if marks is None:
                continue
            low, high = marks
            if high < next_offset:
                next_offsets[p] = next_offset = max(low, high - self.lookback_records)
            elif next_offset < low:                 # retention dropped what was not read yet
                next_offsets[p] = next_offset = low
            if high > next_offset:
                behind[p] = high
        return behind

    def _read(self, consumer: Consumer, behind: dict[int, int], next_offsets: dict[int, int]) -> None:
        """Assigns the partitions in `behind` at their next offsets (assign, never subscribe: every worker reads
        every partition), reads until each reaches its mark or nothing comes for READ_WAIT_S, and unassigns."""
        consumer.assign([TopicPartition(TOPIC, p, next_offsets[p]) for p in behind])
        try:
            pending = dict(behind)
            while pending and not self._stop.is_set():
                first = consumer.poll(READ_WAIT_S)   # returns on the first record, unlike consume()
                if first is None:
                    break
                for msg in [first, *consumer.consume(500, timeout=0)]:
                    if msg.error():
                        continue
                    try:
                        self._take(msg.key(), msg.value(), msg.headers() or [])
                    except Exception:  # noqa: BLE001 - one bad record must not hold the view back: count, move on
                        self.errors += 1
                        log.exception("clock broadcast: skipping a record it could not apply")
                    next_offsets[msg.partition()] = max(next_offsets[msg.partition()], msg.offset() + 1)
                pending = {p: high for p, high in pending.items() if next_offsets[p] < high}
            for tp in consumer.position([TopicPartition(TOPIC, p) for p in behind]):   # past transaction markers
                if tp.offset >= 0:
                    next_offsets[tp.partition] = max(next_offsets[tp.partition], tp.offset)
        finally:
            consumer.unassign()   # librdkafka fetches only while we read (see the module docstring)

    def _run(self) -> None:
        consumer = Consumer(self._conf)
        try:
            next_offsets: dict[int, int] = {}
            while not self._stop.is_set():
                try:
                    next_offsets = self._start_offsets(consumer)
                    break
                except Exception as exc:  # noqa: BLE001 - the broker may still be starting: retry
                    log.warning("clock broadcast: cannot read %s yet: %s", TOPIC, exc)
                    self._stop.wait(1.0)
            while not self._stop.is_set():
                try:
                    behind = self._behind(consumer, next_offsets)
                    if behind:
                        self._read(consumer, behind, next_offsets)
                except Exception:  # noqa: BLE001 - never let the view freeze silently: log, back off, go on
                    self.errors += 1
                    log.exception("clock broadcast: reading %s failed; retrying", TOPIC)
                    self._stop.wait(1.0)
                if not self._stop.is_set():
                    self._stop.wait(self.idle_backoff_s)
        finally:
            consumer.close()

    def _take(self, key: bytes | None, value: bytes | None, headers: list) -> None:
        try:
            batch = decode_batch(TOPIC, key, value, headers)
        except DecodeError as exc:   # the sink dead-letters it; the view just skips it
            log.warning("clock broadcast: skipping a bad record: %s", exc)
            return
        estimates = [e for e in batch.events if isinstance(e, ClockEstimate)]
        with self._lock:
            self.view.add_estimates(estimates)
        self.estimates += len(estimates)
