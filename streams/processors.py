"""Every registered processor in one process and one partition: the in-memory pipeline.

What one worker owning every partition computes, without a broker: the tests and benchmarks run it, and the
record handler routes decoded batches to it. Derived events that other processors consume (per-edge clock
fits, then clock estimates) are fed on at once, where the Faust app sends them through their topics; the
solve of a clock update runs as soon as its fits are in, since here they all come in one batch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from clocktower.control.issuer import CommandIssuer
from clocktower.control.signing import CommandSigner
from clocktower.schemas.analytics import ClockEstimate
from clocktower.schemas.event import Event
from clocktower.streams.clocksync.clock_view import ClockView
from clocktower.streams.emit import Out, records
from clocktower.streams.event_failure import EventFailure
from clocktower.streams.joins.clock_solve import ClockSolve
from clocktower.streams.processor import Processor
from clocktower.streams.processor_context import KNOWN_AFTER_NS, ProcessorContext
from clocktower.streams.processor_runner import ProcessorRunner
from clocktower.streams.registry import build
from clocktower.streams.remediation_budget import RemediationBudget


class Processors:
    def __init__(self, signer: CommandSigner, *, clock_pure_tolerance_ns: float = 2_000.0,
                 clock_update_ns: int = 250_000_000, remediation_budget: RemediationBudget | None = None,
                 segment_ttl_ns: int = 10 * 10**9, clock_ns: Callable[[], int] = time.time_ns,
                 known_after_ns: int = KNOWN_AFTER_NS) -> None:
        """`clock_ns`: the wall clock of the worker this stands for (the budget's and the issuer's; tests set it).
        `known_after_ns`: CLOCKTOWER_STREAMS_KNOWN_AFTER_S (0: every node is known from its first reading)."""
        self.clock_view = ClockView()
        self.budget = remediation_budget or RemediationBudget(clock_ns=clock_ns)
        ctx = ProcessorContext(clocks=self.clock_view, clock_pure_tolerance_ns=clock_pure_tolerance_ns,
                               clock_update_ns=clock_update_ns, segment_ttl_ns=segment_ttl_ns,
                               remediation_budget=self.budget, approval_verifier=signer.verifier(),
                               known_after_ns=known_after_ns)
        issuer = CommandIssuer(signer, clock_ns=clock_ns)
        self.runners = {p.name: ProcessorRunner(p, issuer=issuer) for p in build(ctx)}

    def processor(self, name: str) -> Processor:
        return self.runners[name].processor

    def replace(self, processor: Processor) -> None:
        """Run `processor` in place of the registered one of its name (tests inject faulty ones)."""
        old = self.runners[processor.name]
        self.runners[processor.name] = ProcessorRunner(processor, issuer=old.issuer)

    def on_batch(self, events: Sequence[Event], failures: list[EventFailure] | None = None,
                 record: tuple[str, int, int] | None = None) -> list[Event]:
        """The events derived from a batch (see ProcessorRunner.run for `failures` and `record`, which only the
        batch's own events were read from)."""
        out: list[Event] = []
        batch, own = list(events), failures
        while batch:
            derived: list[Event] = []
            for runner in self.runners.values():
                if any(isinstance(e, runner.processor.consumes) for e in batch):
                    derived += runner.run(0, batch, own, record)
                if isinstance(runner.processor, ClockSolve):
                    derived += runner.processor.solve_now()
            self.clock_view.add_estimates([e for e in derived if isinstance(e, ClockEstimate)])
            out += derived
            batch = [e for e in derived if any(isinstance(e, r.processor.consumes) for r in self.runners.values())]
            own = None if failures is None else _Relabelled(failures)
            record = None
        return out

    def route(self, topic: str, partition: int, events: Sequence[Event], failures: list[EventFailure],
              offset: int | None = None) -> list[Out]:
        """The record handler's router: a decoded batch in, the records to publish out."""
        record = None if offset is None else (topic, partition, offset)
        return list(records(self.on_batch(events, failures, record)))

    @property
    def probe_time_ns(self) -> int:
        return self.runners["clock_edges"].processor.probe_time.now_ns   # type: ignore[attr-defined]


class _Relabelled(list):
    """Failures of derived events are not events of the input batch: they are recorded without an index."""

    def __init__(self, target: list[EventFailure]) -> None:
        super().__init__()
        self.target = target

    def append(self, f: EventFailure) -> None:   # type: ignore[override]
        self.target.append(EventFailure(None, f.error))
