"""The stream processors' pure state, wired together: input batch in, derived events out.

The Faust app (streams/app.py) only decodes records and forwards them here,
which keeps this testable without a broker.
"""

from __future__ import annotations

from schemas.event import Event
from schemas.telemetry import CollectiveEvent, FlowSample, GpuHealth, IterationEvent, LinkState
from streams.command_signing import CommandIssuer
from streams.flow_latency_join import FlowLatencyJoin
from streams.gpu_fault_detector import GpuFaultDetector
from streams.iteration_breakdown import IterationBreakdownAggregator
from streams.link_flap_detector import LinkFlapDetector


class Processors:
    def __init__(self, control_key: bytes) -> None:
        issuer = CommandIssuer(control_key)
        self.flows = FlowLatencyJoin()
        self.iterations = IterationBreakdownAggregator()
        self.links = LinkFlapDetector(issuer)
        self.gpus = GpuFaultDetector(issuer)

    def on_batch(self, events: list[Event]) -> list[Event]:
        out: list[Event] = []
        for e in events:
            if isinstance(e, FlowSample):
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
        return out
