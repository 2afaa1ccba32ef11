"""The stream processors' pure state, wired together: input batch in, derived events out.

The Faust app (streams/app.py) only decodes records and forwards them here,
which keeps this testable without a broker.
"""

from __future__ import annotations

from clocktower.control.issuer import CommandIssuer
from clocktower.schemas.event import Event
from clocktower.schemas.telemetry import ClockProbe, CollectiveEvent, FlowSample, GpuHealth, IterationEvent, LinkState
from clocktower.streams.clocksync import ClockSynchronizer
from clocktower.streams.clocksync.probe_time import ProbeTime
from clocktower.streams.event_failure import EventFailure
from clocktower.streams.flow_latency_join import FlowLatencyJoin
from clocktower.streams.gpu_fault_detector import GpuFaultDetector
from clocktower.streams.iteration_breakdown import IterationBreakdownAggregator
from clocktower.streams.link_flap_detector import LinkFlapDetector
from clocktower.streams.remediation_budget import RemediationBudget


class Processors:
    """Every processor's state. Clock estimates are made on probe time (see clocksync/probe_time.py), every
    `clock_update_ns` of it, so a worker catching up on a backlog estimates as often as a live one.
    Detectors hold no key: they return command intents, and the one issuer here signs them on the way out."""

    def __init__(self, control_key: bytes, *, clock_pure_tolerance_ns: float = 2_000.0,
                 clock_update_ns: int = 250_000_000, remediation_budget: RemediationBudget | None = None) -> None:
        self._issuer = CommandIssuer(control_key)
        self.clocks = ClockSynchronizer(pure_tolerance_ns=clock_pure_tolerance_ns)
        self.clock_update_ns = clock_update_ns
        self._probe_time = ProbeTime()
        self._next_clock_update_ns = 0
        self.flows = FlowLatencyJoin(clocks=self.clocks)
        self.iterations = IterationBreakdownAggregator()
        self.links = LinkFlapDetector()
        self.gpus = GpuFaultDetector(budget=remediation_budget)

    def on_batch(self, events: list[Event], failures: list[EventFailure] | None = None) -> list[Event]:
        """The events derived from a batch. With `failures` given, an event that raises is appended there and
        the others' outputs are still returned (their state changes are kept, so their outputs must be
        published too); without it, the first error propagates. The caller logs: a batch of bad events logs once."""
        out: list[Event] = []
        saw_probes = False
        for i, e in enumerate(events):
            try:
                derived, probe = self._on_event(e)
            except Exception as exc:  # noqa: BLE001 - reported to the caller, which dead-letters the record
                if failures is None:
                    raise
                failures.append(EventFailure(i, exc))
                continue
            out += derived
            saw_probes = saw_probes or probe
        try:
            out += self._clock_update(saw_probes)
        except Exception as exc:  # noqa: BLE001 - as above
            if failures is None:
                raise
            failures.append(EventFailure(None, exc))
        return out

    def _on_event(self, e: Event) -> tuple[list[Event], bool]:
        """One event's derived events, and whether it was a clock probe."""
        if isinstance(e, ClockProbe):
            self.clocks.add_probe(e)
            self._probe_time.observe(e.receiver, e.rx_ns)
            return [], True
        if isinstance(e, FlowSample):
            r = self.flows.add(e)
            return ([r] if r is not None else []), False
        if isinstance(e, CollectiveEvent):
            return self.iterations.add_collective(e), False
        if isinstance(e, IterationEvent):
            return self.iterations.add_iteration(e), False
        if isinstance(e, LinkState):
            return self._issuer.signed(self.links.on_link_state(e)), False
        if isinstance(e, GpuHealth):
            return self._issuer.signed(self.gpus.on_gpu_health(e)), False
        return [], False

    def _clock_update(self, saw_probes: bool) -> list[Event]:
        now = self._probe_time.advance() if saw_probes else self.probe_time_ns
        if now < self._next_clock_update_ns:
            return []
        # once per grid step of probe time crossed
        self._next_clock_update_ns = (now // self.clock_update_ns + 1) * self.clock_update_ns
        return self.clocks.update(now)

    @property
    def probe_time_ns(self) -> int:
        return self._probe_time.now_ns
