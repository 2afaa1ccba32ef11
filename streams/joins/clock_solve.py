"""Clock sync, level 2: one network-effect solve over every edge's latest fit, for the whole fleet.

analytics.clock_edges has one partition, so exactly one worker solves. The fits come from fitters on
several workers, each on its own probe time, and one that runs behind (a busy worker, a backlog) sends
fits that are seconds older than another's. So the solve runs on a watermark: the oldest latest fit
among the edges still reporting. An edge whose latest fit is more than `gone_ns` (10 s) behind the
newest is taken as gone, so a node that leaves holds the solves up for that long at most; a fitter
that lags less delays the estimates instead of losing its edges (measured: one of 3 workers on this
2-core machine ran 2 s behind, and a 2 s cut-off left half the fleet out of most solves).
No solve runs in the first `warmup_ns` (1 s) of fits, so the fitters of workers that started a little later
are in the first solve, and the reference (the smallest node id) is the fleet's, not that of the first edges
to report. Each time the watermark crosses a step of `clock_update_ns`, it solves at the watermark: every edge
then has a fit at least that recent, and
newer fits are read back along their fitted curve. One fitter's fits of one update arrive as several
records; the watermark moves once the last of them is in, so a solve never sees half an update.
A fitter that comes back behind the others (its worker restarted) holds the watermark back until its edges
have caught up, and then gets a solve even if the watermark only reaches the last solved step again.
It publishes a ClockEstimate per node to analytics.clock, which every worker reads back into its
ClockView. Not durable: each fit is a complete summary of its edge, so a new owner has the whole graph
again after one round of fits (one update).
"""

from __future__ import annotations

from typing import Any, ClassVar

from clocktower.schemas.analytics import ClockEdgeFit
from clocktower.schemas.event import Event
from clocktower.streams.clocksync.network_solver import NetworkSolver
from clocktower.streams.processor import Output, Processor
from clocktower.streams.processor_context import ProcessorContext

NS = 1_000_000_000


class ClockSolve(Processor):
    name: ClassVar[str] = "clock_solve"
    consumes: ClassVar[tuple[type[Event], ...]] = (ClockEdgeFit,)
    key_by: ClassVar[str] = "fleet (analytics.clock_edges has one partition)"
    durable: ClassVar[bool] = False

    def __init__(self, update_ns: int = 250_000_000, window_ns: int = 2 * NS, gone_ns: int = 10 * NS,
                 warmup_ns: int = NS) -> None:
        self.solver = NetworkSolver(window_ns=window_ns)
        self.update_ns = update_ns
        self.gone_ns = gone_ns
        self.warmup_ns = warmup_ns   # fitters on other workers start later: the first solves wait for them
        self._latest: dict[tuple[str, str], int] = {}   # edge -> origin of its latest fit
        self._solved_step = -1
        self._solved_edges: set[tuple[str, str]] = set()   # the edges the last solve had
        self._first_ns: int | None = None   # the first fit's origin: no solve in the warm-up after it

    @classmethod
    def from_context(cls, ctx: ProcessorContext) -> ClockSolve:
        return cls(ctx.clock_update_ns)

    def partition_key(self, event: Event) -> str:
        return "fleet"

    def process(self, state: Any, event: Event) -> list[Output]:
        assert isinstance(event, ClockEdgeFit)
        edge = (event.node, event.hi)
        if self._first_ns is None:
            self._first_ns = event.ts_ns
        if event.ts_ns > self._latest.get(edge, -1):
            self._latest[edge] = event.ts_ns
        self.solver.add_fits([event])
        return []

    def watermark(self) -> int | None:
        """The oldest latest fit among the edges still reporting; None before any fit."""
        if not self._latest:
            return None
        newest = max(self._latest.values())
        for edge in [e for e, o in self._latest.items() if o < newest - self.gone_ns]:
            del self._latest[edge]   # gone (node left, edge moved away): it holds nothing up
        return min(self._latest.values())

    def tick(self, state: Any, now_ns: int) -> list[Output]:
        """Solves when the watermark crosses a new step, or reaches the last solved one again with edges that were
        not in that solve: a fitter that comes back (its worker restarted) after the others' fits stopped (the end
        of a run, a fleet gone quiet) would otherwise never see its nodes solved."""
        wm = self.watermark()
        if wm is None or wm - self._first_ns < self.warmup_ns:
            return []
        step = wm // self.update_ns
        if step < self._solved_step or (step == self._solved_step and self._latest.keys() <= self._solved_edges):
            return []
        self._solved_step, self._solved_edges = step, set(self._latest)
        return list(self.solver.update(wm))
