"""Every worker's copy of the clock estimates: a reader of all of analytics.clock, outside the group.

The flow join on every worker corrects latencies with every node's clock, but one worker solves them
(streams/joins/clock_solve.py). faust-streaming's GlobalTable did not update live across two workers on
this broker (measured; faust-streaming#283 reports the same), so each worker runs this plain consumer:
no group, every partition assigned, starting a bounded number of records back (the view keeps only the
latest estimates per node), on its own thread. The view is read under a lock by the join.
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


class ClockBroadcast:
    """ClockCorrection for the flow join, fed from analytics.clock."""

    def __init__(self, bootstrap: str, security: dict[str, str], lookback_records: int = 20_000) -> None:
        self.view = ClockView()
        self.lookback_records = lookback_records
        self._conf: dict[str, Any] = {"bootstrap.servers": bootstrap, "group.id": "clocktower-clock-broadcast",
                                      "enable.auto.commit": False, "fetch.wait.max.ms": 100, **security}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.estimates = 0
        self.errors = 0

    def to_reference(self, node: str, local_ns: int) -> tuple[int, int] | None:
        with self._lock:
            return self.view.to_reference(node, local_ns)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="clock-broadcast", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _assign(self, consumer: Consumer) -> None:
        meta = consumer.list_topics(TOPIC, timeout=10)
        topic = meta.topics.get(TOPIC)
        if topic is None or topic.error is not None or not topic.partitions:
            raise RuntimeError(f"{TOPIC} has no partitions yet")
        tps = []
        for p in sorted(topic.partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=10)
            tps.append(TopicPartition(TOPIC, p, max(low, high - self.lookback_records)))
        consumer.assign(tps)   # assign, never subscribe: every worker reads every partition

    def _run(self) -> None:
        consumer = Consumer(self._conf)
        try:
            while not self._stop.is_set():
                try:
                    self._assign(consumer)
                    break
                except Exception as exc:  # noqa: BLE001 - the broker may still be starting: retry
                    log.warning("clock broadcast: cannot assign %s yet: %s", TOPIC, exc)
                    self._stop.wait(1.0)
            while not self._stop.is_set():
                try:
                    for msg in consumer.consume(500, timeout=0.25):
                        if not msg.error():
                            self._take(msg.key(), msg.value(), msg.headers() or [])
                except Exception:  # noqa: BLE001 - never let the view freeze silently: log, back off, go on
                    self.errors += 1
                    log.exception("clock broadcast: reading %s failed; retrying", TOPIC)
                    self._stop.wait(1.0)
                if not self._stop.is_set():
                    self._stop.wait(0.05)   # the embedded broker answers empty fetches at once
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
