"""Runs the node agent's sources and hands what they emit to one sink, in batches, off their threads.

Sources start in parallel, each checked and started on its own thread, so a slow start (the eBPF flow
source compiles its program with BCC for 7-13 s) never delays another source's events. A source that
has not started within `start_timeout_s` is given up (failed, and stopped if it ever finishes starting):
start-up is bounded. `wait_started()` tells when every source is running, off or failed.

Sources call `emit` from their own threads; events go through a bounded in-memory queue to a single
delivery thread that calls the sink every `flush_interval_s` (or sooner when a batch is large, or at once when
it holds an `urgent` event: the agent's link states, which the pipeline's failover waits for). So a
slow sink (a broker away, a spool being written) never stalls a source, and the sink is only ever called
from one thread. If the queue is full the oldest batches are dropped and counted, never silently; so are
batches still queued when a stuck sink outlives `stop()`. Events the sink refuses (`refused`: the publisher's
per-schema count of events too big for a record) are reported as refused, not delivered.

Actuators (`actuators=`) are a second kind of component with the same contract as a source (check, start(emit),
stop): they are started, reported (under "actuators" in `report()`) and stopped the same way, and what they emit
(their acks) goes through the same delivery. The runner never imports one: the CLI builds them.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from clocktower.producers.agent import metrics
from clocktower.producers.agent.source import Availability, Source
from clocktower.schemas.event import Event

log = logging.getLogger(__name__)

Sink = Callable[[list[Event]], None]
State = Literal["starting", "running", "off", "failed"]
Kind = Literal["source", "actuator"]
DEFAULT_START_TIMEOUT_S = 120.0   # BCC compiles take 7-13 s on a 2-core VM: ~10x headroom for a loaded node


@dataclass
class SourceStatus:
    name: str
    kind: Kind = "source"
    state: State = "starting"
    reason: str = "checking"
    error: str | None = None
    start_s: float | None = None      # seconds from the runner's start until it was running, off or failed
    counts: Counter[str] = field(default_factory=Counter)

    @property
    def enabled(self) -> bool:
        return self.state == "running"


class AgentRunner:
    """`start()` starts every source and actuator in the background, `stop()` stops them and delivers what is left."""

    def __init__(self, sources: Sequence[Source], sink: Sink, *, flush_interval_s: float = 0.1,
                 max_batch_events: int = 5000, max_queued_batches: int = 10_000,
                 start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
                 refused: Callable[[], Mapping[str, int]] | None = None,
                 actuators: Sequence[Source] = (), urgent: Callable[[Event], bool] | None = None) -> None:
        self.sources = list(sources)
        self.actuators = list(actuators)
        self._components = [*self.sources, *self.actuators]
        names = [c.name for c in self._components]
        if len(set(names)) != len(names):
            raise ValueError(f"component names must be unique: {names}")
        self.sink = sink
        self._sink_refused = refused     # the sink's running count of refused events per schema
        self.flush_interval_s = flush_interval_s
        self.urgent = urgent             # events that end the gathering at once (a link's carrier loss)
        self.max_batch_events = max_batch_events
        self.start_timeout_s = start_timeout_s
        self.status: dict[str, SourceStatus] = {s.name: SourceStatus(s.name) for s in self.sources}
        self.status |= {a.name: SourceStatus(a.name, kind="actuator") for a in self.actuators}
        self.delivered: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()   # handed to the sink, which refused them (never sent)
        self.dropped_events = 0
        self.sink_errors = 0
        self.startup_s: float | None = None     # until every source was running, off or failed
        self._queue: queue.Queue[list[Event]] = queue.Queue(maxsize=max_queued_batches)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._stopping = False
        self._started_at = 0.0
        self._settled = threading.Event()
        self._starters: list[threading.Thread] = []
        self._bound: threading.Timer | None = None

    # -- starting --------------------------------------------------------------------------------------

    def start(self) -> dict[str, SourceStatus]:
        """Start delivery and every source's check-and-start on its own thread; returns at once."""
        self._started_at = time.monotonic()
        self._thread = threading.Thread(target=self._deliver, name="agent-delivery", daemon=True)
        self._thread.start()
        self._starters = [threading.Thread(target=self._start_one, args=(src,), name=f"agent-start-{src.name}",
                                           daemon=True) for src in self._components]
        for t in self._starters:
            t.start()
        self._bound = threading.Timer(self.start_timeout_s, self._give_up_slow)
        self._bound.daemon = True
        self._bound.start()
        with self._lock:
            self._check_settled()         # no sources at all
        return self.status

    def wait_started(self, timeout: float | None = None) -> bool:
        """True once every source is running, off or failed (never later than `start_timeout_s`)."""
        return self._settled.wait(timeout)

    def _start_one(self, src: Source) -> None:
        try:
            avail = src.check()
        except Exception as exc:  # a check must not raise; if one does, the source stays off
            avail = Availability(False, f"check failed: {exc!r}")
        if not avail.ok:
            self._settle(src.name, "off", avail.reason)
            log.info("source %s off: %s", src.name, avail.reason)
            return
        with self._lock:
            st = self.status[src.name]
            if st.state == "starting" and self._stopping:
                self._settle_locked(st, "off", "the agent stopped before this source started")
            if st.state != "starting":      # given up while its check ran, or the agent is stopping
                return
            st.reason = avail.reason
        try:
            src.start(self.emit)
        except Exception as exc:
            self._settle(src.name, "failed", avail.reason, error=f"start failed: {exc}")
            log.error("source %s failed to start: %s", src.name, exc)
            return
        if self._settle(src.name, "running", avail.reason):
            log.info("source %s on: %s", src.name, avail.reason)
            return
        took = time.monotonic() - self._started_at   # given up, or the agent is stopping: not wanted any more
        log.warning("source %s started after %.1f s, when no longer wanted: stopping it", src.name, took)
        try:
            src.stop()
        except Exception as exc:
            log.error("source %s failed to stop: %s", src.name, exc)

    def _settle(self, name: str, state: State, reason: str, error: str | None = None) -> bool:
        """Record how a source's start ended; False if it was already given up (or the agent stops)."""
        with self._lock:
            st = self.status[name]
            if st.state != "starting" or (self._stopping and state == "running"):
                if st.state == "starting":
                    self._settle_locked(st, "off", "the agent stopped before this source finished starting")
                return False
            self._settle_locked(st, state, reason, error)
            return True

    def _settle_locked(self, st: SourceStatus, state: State, reason: str, error: str | None = None) -> None:
        st.state, st.reason, st.error = state, reason, error
        st.start_s = round(time.monotonic() - self._started_at, 3)
        self._check_settled()

    def _check_settled(self) -> None:
        if not self._settled.is_set() and all(s.state != "starting" for s in self.status.values()):
            self.startup_s = round(time.monotonic() - self._started_at, 3)
            self._settled.set()

    def _give_up_slow(self) -> None:
        with self._lock:
            for st in self.status.values():
                if st.state == "starting":
                    self._settle_locked(st, "failed", st.reason, error=(
                        f"did not start within {self.start_timeout_s:g} s (stopped if it ever does)"))
                    log.error("source %s did not start within %g s", st.name, self.start_timeout_s)

    # -- delivery --------------------------------------------------------------------------------------

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
                    got = self._queue.get(timeout=timeout)
                except queue.Empty:
                    break
                batch += got
                if self.urgent is not None and any(self.urgent(e) for e in got):
                    break
            if batch:
                self._send(batch)

    def _send(self, batch: list[Event]) -> None:
        before = Counter(self._sink_refused()) if self._sink_refused is not None else Counter()
        try:
            self.sink(batch)
        except Exception as exc:   # the sink (spooling publisher) owns durability; count and go on
            self.sink_errors += 1
            metrics.DROPPED.inc(len(batch))
            with self._lock:
                self.dropped_events += len(batch)
            log.error("sink failed for %d events (dropped): %s", len(batch), exc)
            return
        sent = Counter(type(e).SCHEMA for e in batch)
        refused = Counter(self._sink_refused()) - before if self._sink_refused is not None else Counter()
        refused &= sent                # only this batch's (the sink is called from this thread only)
        with self._lock:
            self.refused.update(refused)
            self.delivered.update(sent - refused)
        for schema, n in (sent - refused).items():
            metrics.EVENTS.labels(schema).inc(n)
        for schema, n in refused.items():
            metrics.REFUSED.labels(schema).inc(n)

    # -- stopping --------------------------------------------------------------------------------------

    def stop(self, timeout: float = 10.0) -> None:
        """Stop running sources; one still starting is stopped by its own thread once its start returns,
        waited for no longer than the start bound. Then deliver what is left."""
        with self._lock:
            self._stopping = True
            running = [src for src in self._components if self.status[src.name].enabled]
        if self._bound is not None:
            self._bound.cancel()
        for src in running:
            try:
                src.stop()
            except Exception as exc:
                log.error("source %s failed to stop: %s", src.name, exc)
        start_deadline = self._started_at + self.start_timeout_s
        for t in self._starters:
            t.join(max(0.0, start_deadline - time.monotonic()))
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._closed = True
        if self._thread is None or not self._thread.is_alive():   # the sink is only ever called from one thread
            while not self._queue.empty():   # raced in after the delivery thread's last look
                self._send(self._queue.get_nowait())
        else:                                # the sink is stuck: what is still queued is never sent
            self._drop_queued()
        for src in self._components:
            self.status[src.name].counts = Counter(src.counts)

    def _drop_queued(self) -> None:
        left = 0
        while True:
            try:
                left += len(self._queue.get_nowait())   # taken: the stuck thread cannot send it later
            except queue.Empty:
                break
        if left:
            with self._lock:
                self.dropped_events += left
            log.warning("the sink did not return within the stop timeout: dropped the %d events still queued", left)

    def report(self) -> dict:
        """Per source, and per actuator apart: state, enabled (running), why, seconds to start, events emitted per
        schema (an actuator's other counts too); plus what the sink took (delivered) and refused, per schema, and
        the events dropped."""
        with self._lock:
            rows = {n: (s.kind, {"enabled": s.enabled, "state": s.state, "reason": s.reason,
                                 **({"error": s.error} if s.error else {}), "start_s": s.start_s,
                                 "events": dict(sorted(s.counts.items()))}) for n, s in self.status.items()}
        return {
            "sources": {n: row for n, (kind, row) in rows.items() if kind == "source"},
            "actuators": {n: row for n, (kind, row) in rows.items() if kind == "actuator"},
            "startup_s": self.startup_s,
            "delivered": dict(sorted(self.delivered.items())),
            "refused": dict(sorted(self.refused.items())),
            "dropped_events": self.dropped_events,
            "sink_errors": self.sink_errors,
        }
