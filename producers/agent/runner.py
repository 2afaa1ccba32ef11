"""Runs the node agent's sources and hands what they emit to one sink, in batches, off their threads.

Sources call `emit` from their own threads; events go through a bounded in-memory queue to a single
delivery thread that calls the sink every `flush_interval_s` (or sooner when a batch is large). So a
slow sink (a broker away, a spool being written) never stalls a source, and the sink is only ever called
from one thread. If the queue is full the oldest batches are dropped and counted, never silently.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from clocktower.producers.agent.source import Availability, Source
from clocktower.schemas.event import Event

log = logging.getLogger(__name__)

Sink = Callable[[list[Event]], None]


@dataclass
class SourceStatus:
    name: str
    enabled: bool
    reason: str
    error: str | None = None
    counts: Counter[str] = field(default_factory=Counter)


class AgentRunner:
    """`start()` checks and starts every source, `stop()` stops them and delivers what is left."""

    def __init__(self, sources: Sequence[Source], sink: Sink, *, flush_interval_s: float = 0.1,
                 max_batch_events: int = 5000, max_queued_batches: int = 10_000) -> None:
        self.sources = list(sources)
        self.sink = sink
        self.flush_interval_s = flush_interval_s
        self.max_batch_events = max_batch_events
        self.status: dict[str, SourceStatus] = {}
        self.delivered: Counter[str] = Counter()
        self.dropped_events = 0
        self.sink_errors = 0
        self._queue: queue.Queue[list[Event]] = queue.Queue(maxsize=max_queued_batches)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False

    def start(self) -> dict[str, SourceStatus]:
        self._thread = threading.Thread(target=self._deliver, name="agent-delivery", daemon=True)
        self._thread.start()
        for src in self.sources:
            try:
                avail = src.check()
            except Exception as exc:  # a check must not raise; if one does, the source stays off
                avail = Availability(False, f"check failed: {exc!r}")
            st = self.status[src.name] = SourceStatus(src.name, avail.ok, avail.reason)
            if not avail.ok:
                log.info("source %s off: %s", src.name, avail.reason)
                continue
            try:
                src.start(self.emit)
                log.info("source %s on: %s", src.name, avail.reason)
            except Exception as exc:
                st.enabled, st.error = False, f"start failed: {exc}"
                log.error("source %s failed to start: %s", src.name, exc)
        return self.status

    def emit(self, events: list[Event]) -> None:
        """Thread-safe: queue a batch for the sink; when the queue is full, drop the oldest batch."""
        if not events:
            return
        if self._closed:               # a source thread that outlived its stop(): too late, but counted
            with self._lock:
                self.dropped_events += len(events)
            log.warning("dropped %d events emitted after the agent stopped", len(events))
            return
        while True:
            try:
                self._queue.put_nowait(list(events))
                return
            except queue.Full:
                try:
                    old = self._queue.get_nowait()
                except queue.Empty:
                    continue
                with self._lock:
                    self.dropped_events += len(old)
                log.warning("agent queue full: dropped %d events (%d so far)", len(old), self.dropped_events)

    def _deliver(self) -> None:
        while not (self._stop.is_set() and self._queue.empty()):
            batch: list[Event] = []
            deadline = time.monotonic() + self.flush_interval_s
            while len(batch) < self.max_batch_events:
                timeout = deadline - time.monotonic()
                if timeout <= 0:
                    break
                try:
                    batch += self._queue.get(timeout=timeout)
                except queue.Empty:
                    break
            if batch:
                self._send(batch)

    def _send(self, batch: list[Event]) -> None:
        try:
            self.sink(batch)
        except Exception as exc:   # the sink (spooling publisher) owns durability; count and go on
            self.sink_errors += 1
            with self._lock:
                self.dropped_events += len(batch)
            log.error("sink failed for %d events (dropped): %s", len(batch), exc)
            return
        self.delivered.update(type(e).SCHEMA for e in batch)

    def stop(self, timeout: float = 10.0) -> None:
        for src in self.sources:
            st = self.status.get(src.name)
            if st is not None and st.enabled:
                try:
                    src.stop()
                except Exception as exc:
                    log.error("source %s failed to stop: %s", src.name, exc)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._closed = True
        if self._thread is None or not self._thread.is_alive():   # the sink is only ever called from one thread
            while not self._queue.empty():   # raced in after the delivery thread's last look
                self._send(self._queue.get_nowait())
        for src in self.sources:
            st = self.status.get(src.name)
            if st is not None:
                st.counts = Counter(src.counts)

    def report(self) -> dict:
        """Per source: enabled, why, events emitted per schema; plus what reached the sink."""
        return {
            "sources": {n: {"enabled": s.enabled, "reason": s.reason, **({"error": s.error} if s.error else {}),
                            "events": dict(sorted(s.counts.items()))} for n, s in self.status.items()},
            "delivered": dict(sorted(self.delivered.items())),
            "dropped_events": self.dropped_events,
            "sink_errors": self.sink_errors,
        }
