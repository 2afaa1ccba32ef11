"""The agent's heartbeat: a `NodeHeartbeat` every `interval_s`, so the pipeline can tell a silent node from a
quiet one (a node whose GPUs and links have nothing new to say still reports them periodically, but a node
running no GPU or link source would otherwise say nothing at all)."""

from __future__ import annotations

import threading
import time
from collections import Counter

from clocktower.producers.agent.source import Availability, Emit
from clocktower.producers.event_builder import EventBuilder
from clocktower.schemas.telemetry import NodeHeartbeat


class HeartbeatSource:
    name = "heartbeat"

    def __init__(self, node: str, interval_s: float = 0.2) -> None:
        if not 0 < interval_s <= 3600:
            raise ValueError(f"heartbeat interval must be in (0, 3600] s (got {interval_s})")
        self.node = node
        self.interval_s = interval_s
        self.counts: Counter[str] = Counter()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._build = EventBuilder(NodeHeartbeat)

    def check(self) -> Availability:
        return Availability(True, f"every {self.interval_s * 1000:.0f} ms")

    def start(self, emit: Emit) -> None:
        self._thread = threading.Thread(target=self._run, args=(emit,), name="heartbeat", daemon=True)
        self._thread.start()

    def _run(self, emit: Emit) -> None:
        interval_ms = max(1, round(self.interval_s * 1000))
        seq = 0
        next_at = time.monotonic()
        while not self._stop.is_set():
            emit([self._build(node=self.node, ts_ns=time.time_ns(), seq=seq, interval_ms=interval_ms)])
            self.counts[NodeHeartbeat.SCHEMA] += 1
            seq += 1
            next_at += self.interval_s
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
