"""Clock sync, level 2: one network-effect solve over every edge's latest fit, for the whole fleet.

analytics.clock_edges has one partition, so exactly one worker solves. Fitters on several workers update
on the same grid of probe time (`clock_update_ns`) but each publishes when it crosses a step, so the fits of
one step arrive spread out: the solve of a step runs when the first fit of a later step arrives, by when
the step's fits are in (a fit that is later still is extrapolated from the edge's previous one). It
publishes a ClockEstimate per node to analytics.clock, which every worker reads back into its
ClockView. Not durable: each fit is a complete summary of its edge, so a new owner has the whole graph
again after one round of fits (one update, 250 ms).
"""

from __future__ import annotations

from typing import Any, ClassVar

from clocktower.schemas.analytics import ClockEdgeFit
from clocktower.schemas.event import Event
from clocktower.streams.clocksync.network_solver import NetworkSolver
from clocktower.streams.processor import Output, Processor
from clocktower.streams.processor_context import ProcessorContext


class ClockSolve(Processor):
    name: ClassVar[str] = "clock_solve"
    consumes: ClassVar[tuple[type[Event], ...]] = (ClockEdgeFit,)
    key_by: ClassVar[str] = "fleet (analytics.clock_edges has one partition)"
    durable: ClassVar[bool] = False

    def __init__(self, update_ns: int = 250_000_000) -> None:
        self.solver = NetworkSolver()
        self.update_ns = update_ns
        self._step = -1          # the grid step whose fits are coming in
        self._step_end_ns = 0    # the newest fit origin of that step: the time it is solved at
        self._due: int | None = None
        self._solved_step = -1

    @classmethod
    def from_context(cls, ctx: ProcessorContext) -> ClockSolve:
        return cls(ctx.clock_update_ns)

    def partition_key(self, event: Event) -> str:
        return "fleet"

    def process(self, state: Any, event: Event) -> list[Output]:
        assert isinstance(event, ClockEdgeFit)
        step = event.ts_ns // self.update_ns
        if step > self._step:
            if self._step > self._solved_step:
                self._due = self._step_end_ns
                self._solved_step = self._step
            self._step, self._step_end_ns = step, event.ts_ns
        elif step == self._step:
            self._step_end_ns = max(self._step_end_ns, event.ts_ns)
        self.solver.add_fits([event])
        return []

    def tick(self, state: Any, now_ns: int) -> list[Output]:
        if self._due is None:
            return []
        due, self._due = self._due, None
        return list(self.solver.update(due))

    def solve_now(self) -> list[Output]:
        """Solve the step whose fits are in without waiting for the next (the in-memory pipeline, where a
        step's fits all come in one batch)."""
        if self._step <= self._solved_step:
            return []
        self._solved_step = self._step
        return list(self.solver.update(self._step_end_ns))
