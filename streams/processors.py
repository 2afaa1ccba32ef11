"""The stream processors' pure state, wired together: input batch in, derived events out.

The Faust app (streams/app.py) only decodes records and forwards them here,
which keeps this testable without a broker.
"""

from __future__ import annotations

from schemas.event import Event
from schemas.telemetry import ClockProbe, CollectiveEvent, FlowSample, GpuHealth, IterationEvent, LinkState
from streams.clocksync import ClockSynchronizer
from streams.clocksync.probe_time import ProbeTime
from streams.command_signing import CommandIssuer
from streams.flow_latency_join import FlowLatencyJoin
from streams.gpu_fault_detector import GpuFaultDetector
from streams.iteration_breakdown import IterationBreakdownAggregator
from streams.link_flap_detector import LinkFlapDetector
from streams.remediation_budget import RemediationBudget


class Processors:
    """Every processor's state. Clock estimates are made on probe time (see clocksync/probe_time.py), every
    `clock_update_ns` of it, so a worker catching up on a backlog estimates as often as a live one."""

    def __init__(self, control_key: bytes, *, clock_pure_tolerance_ns: float = 2_000.0,
                 clock_update_ns: int = 250_000_000, remediation_budget: RemediationBudget | None = None) -> None:
        issuer = CommandIssuer(control_key)
        self.clocks = ClockSynchronizer(pure_tolerance_ns=clock_pure_tolerance_ns)
        self.clock_update_ns = clock_update_ns
        self._probe_time = ProbeTime()
        self._next_clock_update_ns = 0
        self.flows = FlowLatencyJoin(clocks=self.clocks)
        self.iterations = IterationBreakdownAggregator()
        self.links = LinkFlapDetector(issuer)
        self.gpus = GpuFaultDetector(issuer, remediation_budget)

    def on_batch(self, events: list[Event]) -> list[Event]:
        out: list[Event] = []
        saw_probes = False
        for e in events:
            if isinstance(e, ClockProbe):
                self.clocks.add_probe(e)
                self._probe_time.observe(e.receiver, e.rx_ns)
                saw_probes = True
            elif isinstance(e, FlowSample):
                r = self.flows.add(e)
                if r is not None:
                    out.append(r)
            elif isinstance(e, CollectiveEvent):
                out += self.iterations.add_collective(e)
            elif isinstance(e, IterationEvent):
                out += self.iterations.add_iteration(e)
            elif isinstance(e, LinkState):
                out += self.links.on_link_state(e)
            elif isinstance(e, GpuHealth):
                out += self.gpus.on_gpu_health(e)
        now = self._probe_time.advance() if saw_probes else self.probe_time_ns
        if now >= self._next_clock_update_ns:   # once per grid step of probe time crossed
            self._next_clock_update_ns = (now // self.clock_update_ns + 1) * self.clock_update_ns
            out += self.clocks.update(now)
        return out

    @property
    def probe_time_ns(self) -> int:
        return self._probe_time.now_ns
