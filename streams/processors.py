"""Every registered processor in one process: the in-memory pipeline, on the app's own router.

What one worker owning every partition computes, without a broker: the tests and benchmarks run it, and the
record handler routes decoded batches to it. It routes each batch through the same `Topology` as the Faust app
(streams/topology.py); where the app publishes what a batch makes, this feeds it back at once: regrouped events
to the processors behind their repartition topic, derived events (per-edge clock fits, then clock estimates) to
the processors that read their topic, and clock estimates into the ClockView, as the app's ClockBroadcast does.
A batch of events from several topics (a simulator's step) is routed one topic at a time, in order of first
appearance; a processor sees its events in their order within one topic and one partition. Derived events are
fed back on partition 0: every derived topic a processor reads has one partition (checked).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence

from clocktower.control.issuer import CommandIssuer
from clocktower.control.signing import CommandSigner
from clocktower.schemas.analytics import ClockEstimate
from clocktower.schemas.event import Event
from clocktower.schemas.partitioning import partition_of
from clocktower.schemas.topics import topic_for
from clocktower.streams.clocksync.clock_view import ClockView
from clocktower.streams.emit import Out, records
from clocktower.streams.event_failure import EventFailure
from clocktower.streams.processor import Processor
from clocktower.streams.processor_context import KNOWN_AFTER_NS, ProcessorContext
from clocktower.streams.processor_runner import ProcessorRunner
from clocktower.streams.registry import build
from clocktower.streams.remediation_budget import RemediationBudget
from clocktower.streams.topology import Topology

Batch = tuple[str, int, list[Event], "list[EventFailure] | None", "int | None"]   # topic, partition, events, ...


class Processors:
    def __init__(self, signer: CommandSigner, *, clock_pure_tolerance_ns: float = 2_000.0,
                 clock_update_ns: int = 250_000_000, remediation_budget: RemediationBudget | None = None,
                 segment_ttl_ns: int = 10 * 10**9, clock_ns: Callable[[], int] = time.time_ns,
                 known_after_ns: int = KNOWN_AFTER_NS, clock_wait_ns: int = 0) -> None:
        """`clock_ns`: the wall clock of the worker this stands for (the budget's and the issuer's; tests set it).
        `known_after_ns`: CLOCKTOWER_STREAMS_KNOWN_AFTER_S (0: every node is known from its first reading).
        `clock_wait_ns`: CLOCKTOWER_STREAMS_CLOCK_WAIT_S, how long a flow segment waits for its clock estimates;
        0 here (publish at once), so a test sees a flow's latency as soon as it is joined."""
        self.clock_view = ClockView()
        self.budget = remediation_budget or RemediationBudget(clock_ns=clock_ns)
        ctx = ProcessorContext(clocks=self.clock_view, clock_pure_tolerance_ns=clock_pure_tolerance_ns,
                               clock_update_ns=clock_update_ns, segment_ttl_ns=segment_ttl_ns,
                               remediation_budget=self.budget, approval_verifier=signer.verifier(),
                               known_after_ns=known_after_ns, clock_wait_ns=clock_wait_ns)
        self.topology = Topology(build(ctx), CommandIssuer(signer, clock_ns=clock_ns), self.budget, lambda p: None)

    @property
    def runners(self) -> dict[str, ProcessorRunner]:
        """The runners by name (a new dict: use `replace` to swap one)."""
        return {r.processor.name: r for r in self.topology.runners}

    def processor(self, name: str) -> Processor:
        return self.runners[name].processor

    def replace(self, processor: Processor) -> None:
        """Run `processor` in place of the registered one of its name (tests inject faulty ones)."""
        self.topology.replace(processor)

    def on_batch(self, events: Sequence[Event], failures: list[EventFailure] | None = None,
                 record: tuple[str, int, int] | None = None) -> list[Event]:
        """The events derived from a batch, and from those in turn. With `failures`, an event that raises is recorded
        there (by its index in `events`; a derived one, without) and the others go on; without, it raises.
        `record`: the (topic, partition, offset) the batch was read from (one topic's events, then)."""
        if record is not None:
            return self._run([(record[0], record[1], list(events), failures, record[2])], failures)
        return self._run([(topic, 0, evs, _Reindexed(failures, at) if failures is not None else None, None)
                          for topic, (at, evs) in _by_topic(events).items()], failures)

    def on_timer(self) -> list[Event]:
        """What the worker's timer makes: the partitions with work waiting on its clock ticked (Topology.tick_due),
        and what their outputs make in turn."""
        return self._run([], None, self.topology.tick_due(None))

    def _run(self, batches: list[Batch], failures: list[EventFailure] | None,
             first: list[Event] | None = None) -> list[Event]:
        """`first`: derived events to start with (a timer's), before `batches`."""
        out: list[Event] = []
        queue = deque(batches)
        derived_failures = None if failures is None else _Relabelled(failures)
        pending = first
        while queue or pending is not None:
            if pending is not None:
                derived, parts, part_at, fails, pending = pending, [], [], None, None
            else:
                topic, partition, evs, fails, offset = queue.popleft()
                derived, parts, part_at = self.topology.step(topic, partition, evs, fails, offset)
            self.clock_view.add_estimates([e for e in derived if isinstance(e, ClockEstimate)])
            out += derived
            # a regrouped event that fails is recorded by its index in the batch it came from
            queue.extend((t, p, es, None if fails is None else _Reindexed(fails, at), None)
                         for (t, p, es), at in zip(parts, part_at, strict=True))
            for t, (_, es) in _by_topic(derived).items():
                if self.topology.reads(t):
                    partitions = topic_for(type(es[0])).partitions
                    if partitions == 1:
                        queue.append((t, 0, es, derived_failures, None))
                        continue
                    by_partition: dict[int, list[Event]] = {}   # as the producer spreads them: by node
                    for e in es:
                        by_partition.setdefault(partition_of(e.node, partitions), []).append(e)
                    queue.extend((t, p, part, derived_failures, None) for p, part in sorted(by_partition.items()))
        return out

    def route(self, topic: str, partition: int, events: Sequence[Event], failures: list[EventFailure],
              offset: int | None = None) -> list[Out]:
        """The record handler's router: a decoded batch in, the records to publish out."""
        return list(records(self._run([(topic, partition, list(events), failures, offset)], failures)))

    @property
    def probe_time_ns(self) -> int:
        return self.runners["clock_edges"].processor.probe_time.now_ns   # type: ignore[attr-defined]


def _by_topic(events: Sequence[Event]) -> dict[str, tuple[list[int], list[Event]]]:
    """The events of each topic, with their indexes in `events`, topics in order of first appearance."""
    out: dict[str, tuple[list[int], list[Event]]] = {}
    for i, e in enumerate(events):
        at, evs = out.setdefault(topic_for(type(e)).name, ([], []))
        at.append(i)
        evs.append(e)
    return out


class _Reindexed(list):
    """Failures of one topic's share of a mixed batch, recorded by the event's index in the whole batch."""

    def __init__(self, target: list[EventFailure], at: list[int]) -> None:
        super().__init__()
        self.target, self.at = target, at

    def append(self, f: EventFailure) -> None:   # type: ignore[override]
        self.target.append(EventFailure(None if f.index is None else self.at[f.index], f.error))


class _Relabelled(list):
    """Failures of derived events are not events of the input batch: they are recorded without an index."""

    def __init__(self, target: list[EventFailure]) -> None:
        super().__init__()
        self.target = target

    def append(self, f: EventFailure) -> None:   # type: ignore[override]
        self.target.append(EventFailure(None, f.error))
