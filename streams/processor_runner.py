"""Runs one processor over the batches of its partitions: failures per event, timers, state, signing.

The same runner serves the Faust app (state in a changelogged table) and the in-memory pipeline of the
tests and benchmarks (state in a dict), so both run the same code path from event to signed output.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from clocktower.control.issuer import CommandIssuer
from clocktower.schemas.event import Event
from clocktower.streams import metrics
from clocktower.streams.delivery import delivery_of
from clocktower.streams.event_clock import PartitionClock
from clocktower.streams.event_failure import EventFailure
from clocktower.streams.processor import Processor
from clocktower.streams.state_store import StateStore

log = logging.getLogger(__name__)

class ProcessorRunner:
    def __init__(self, processor: Processor, store: StateStore | None = None,
                 issuer: CommandIssuer | None = None) -> None:
        self.processor = processor
        self.store = store if store is not None else StateStore(processor)
        self.issuer = issuer
        self.clock = PartitionClock()
        self._expired_seen = 0
        self._refused_seen = 0

    def run(self, partition: int, events: Sequence[Event], failures: list[EventFailure] | None = None,
            record: tuple[str, int, int] | None = None) -> list[Event]:
        """The signed outputs of a batch from `partition`. With `failures`, an event that raises is recorded
        there and the others' outputs still returned (their state changes are kept); without, it raises.
        `record`: the (topic, partition, offset) the batch was read from, so each event's position reaches the processor
        (streams/delivery.py); None where there is no record (the in-memory pipeline)."""
        proc, store = self.processor, self.store
        store.partition = partition
        mine = [(i, e) for i, e in enumerate(events) if isinstance(e, proc.consumes)]
        for _, e in mine:
            self.clock.observe(partition, e.node, e.ts_ns)
        store.now_ns = self.clock.now(partition)
        out: list = []
        try:
            for i, e in mine:
                store.delivery = None if record is None else delivery_of(*record, i)
                try:
                    out += proc.process(store, e)
                except Exception as exc:  # noqa: BLE001 - reported to the caller, which dead-letters the record
                    if failures is None:
                        raise
                    failures.append(EventFailure(i, exc))
            try:
                out += proc.tick(store, store.now_ns)
            except Exception as exc:  # noqa: BLE001 - as above
                if failures is None:
                    raise
                failures.append(EventFailure(None, exc))
        finally:
            store.delivery = None
            store.flush()
            self._export()
        return self._signed(out)

    def _export(self) -> None:
        name = self.processor.name
        if self.store.expired > self._expired_seen:
            metrics.STATE_EXPIRED.labels(name).inc(self.store.expired - self._expired_seen)
            self._expired_seen = self.store.expired
        refused = self.store.refused
        if refused > self._refused_seen:
            metrics.STATE_REFUSED.labels(name).inc(refused - self._refused_seen)
            if refused.bit_length() > self._refused_seen.bit_length():   # at 1, 2, 4, 8, ... refusals
                log.warning("%s: %d new state keys not kept: a partition holds %d entries already "
                            "(CLOCKTOWER_STREAMS_MAX_ENTRIES); their events are processed as if each were the "
                            "first of its key", name, refused, self.store.max_entries)
            self._refused_seen = refused
        for count, value in self.processor.counters().items():
            metrics.PROCESSOR_COUNTS.labels(name, count).set(value)

    def _signed(self, out: list) -> list[Event]:
        if self.issuer is not None:
            return self.issuer.signed(out)
        if any(not isinstance(e, Event) for e in out):
            raise RuntimeError(f"{self.processor.name} returned command intents, and no issuer signs them")
        return out
