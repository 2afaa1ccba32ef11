"""Clock sync, level 1: per-edge pair fits, partitioned by probe edge.

Every probe of an edge (the node pair, either direction) reaches the same worker, whose EdgeFitter fits
the edges it owns and publishes a `ClockEdgeFit` summary per edge every `clock_update_ns` of probe time
(a few numbers per edge) to analytics.clock_edges, where level 2 (clock_solve.py) solves the network.
Not durable: an edge's fit uses its last 2 s of probes, so a worker that takes an edge over refits it
from new probes within about a window, which costs less than changelogging every probe.
"""

from __future__ import annotations

from typing import Any, ClassVar

from clocktower.schemas.event import Event
from clocktower.schemas.telemetry import ClockProbe
from clocktower.streams.clocksync.edge_fitter import EdgeFitter
from clocktower.streams.clocksync.probe_time import ProbeTime
from clocktower.streams.processor import Output, Processor
from clocktower.streams.processor_context import ProcessorContext


class ClockEdgeFits(Processor):
    name: ClassVar[str] = "clock_edges"
    consumes: ClassVar[tuple[type[Event], ...]] = (ClockProbe,)
    key_by: ClassVar[str] = "probe edge (node pair)"
    durable: ClassVar[bool] = False

    def __init__(self, pure_tolerance_ns: float = 2_000.0, update_ns: int = 250_000_000) -> None:
        self.fitter = EdgeFitter(pure_tolerance_ns=pure_tolerance_ns)
        self.update_ns = update_ns
        self.probe_time = ProbeTime()
        self._next_update_ns = 0

    @classmethod
    def from_context(cls, ctx: ProcessorContext) -> ClockEdgeFits:
        return cls(ctx.clock_pure_tolerance_ns, ctx.clock_update_ns)

    def partition_key(self, event: Event) -> str:
        assert isinstance(event, ClockProbe)
        lo, hi = sorted((event.sender, event.receiver))
        return f"{lo}|{hi}"

    def process(self, state: Any, event: Event) -> list[Output]:
        assert isinstance(event, ClockProbe)
        self.fitter.add_probe(event)
        self.probe_time.observe(event.receiver, event.rx_ns)
        return []

    def tick(self, state: Any, now_ns: int) -> list[Output]:
        """Fits once per grid step of probe time crossed (a worker catching up estimates as often as a live one)."""
        now = self.probe_time.advance()
        if now < self._next_update_ns:
            return []
        self._next_update_ns = (now // self.update_ns + 1) * self.update_ns
        return list(self.fitter.update(now))
