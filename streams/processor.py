"""The one contract every stream processor follows.

A processor declares what it reads, how its input is partitioned, what state it keeps and how long, and
what it does with one event (`process`) and with the passing of event time (`tick`). Everything that needs
the list of processors (the Faust app's agents and tables, the repartition and changelog topics, the drain
check, the in-memory pipeline of the tests) derives it from streams/registry.py, never from a second list.

Partitioning is what lets N workers give the answers of one: every event that one piece of state needs must
reach the worker that owns that state. Telemetry records are keyed by node; a processor whose state spans
nodes (a flow's two ends, a job's ranks, a probe edge's two nodes) says so with `key_by` != "node", and the
app regroups its input by `partition_key` through a repartition topic before `process` sees it.

State lives in a `StateStore` (streams/state_store.py): entries by `state_key`, each with an event-time
expiry, backed by a Faust table with a changelog in the app and by a dict in tests. An entry's key must
fall in the partition of the event that writes it: `state_key` refines `partition_key`, never crosses it.
`process` must be idempotent under redelivery (a worker killed before it commits replays its last seconds
over state that already saw them): the processors drop what they have seen, or re-emit the same result.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection
from typing import Any, ClassVar

import orjson

from clocktower.control.intent import CommandIntent
from clocktower.schemas.event import Event
from clocktower.schemas.partitioning import partition_of  # noqa: F401 - re-exported: the streams regroup with it
from clocktower.streams.processor_context import ProcessorContext

Output = Event | CommandIntent


class Processor(ABC):
    """One stream processor. Subclasses set the class attributes and implement `process`."""

    name: ClassVar[str]                        # its table, changelog and repartition topic are named after it
    consumes: ClassVar[tuple[type[Event], ...]]
    key_by: ClassVar[str] = "node"             # what `partition_key` is, in words ("node" = the records' own key)
    durable: ClassVar[bool] = True             # state in a changelogged table; False: rebuilt from input
    state_ttl_ns: int = 3600 * 10**9          # an entry not written for this much event time expires (an
                                               # instance sets its own from its options)

    @classmethod
    def from_context(cls, ctx: ProcessorContext) -> Processor:
        """The processor a worker runs, built from its settings and shared objects."""
        return cls()

    def partition_key(self, event: Event) -> str:
        """The key that decides which partition, hence which worker, an event goes to."""
        return event.node

    @abstractmethod
    def process(self, state: Any, event: Event) -> list[Output]:
        """The outputs of one event; `state` is the processor's StateStore."""

    def tick(self, state: Any, now_ns: int) -> list[Output]:
        """Timers: called after each batch with the partition's event time. By default expires old entries."""
        return self.on_expired(state.expire(now_ns))

    def due_partitions(self) -> Collection[int]:
        """Partitions with work that waits on the worker's own clock rather than on events (the flow join's segments
        held for their clock estimates): the worker ticks them on a timer even when no record comes. None by default."""
        return ()

    def revoked(self) -> None:
        """This worker's partitions were taken away: forget what `due_partitions` tracks (their state stays)."""
        return None

    def restored(self, partition: int, key: str, data: bytes) -> None:
        """An entry (still encoded) of the table this worker recovered after a rebalance: where `due_partitions`
        tracks work in the state, pick it up again here (the partitions' last owner may have died). Nothing by
        default."""
        return None

    def on_expired(self, expired: list[tuple[str, Any]]) -> list[Output]:
        """What expired entries produce (by default nothing); a processor counts its expiries here."""
        return []

    def counters(self) -> dict[str, int]:
        """Its running counts (duplicates dropped, entries expired, ...), exported as metrics."""
        return {}

    def encode_state(self, value: Any) -> bytes:
        raise NotImplementedError(f"{self.name} keeps no table state")

    def decode_state(self, data: bytes) -> Any:
        raise NotImplementedError(f"{self.name} keeps no table state")


def compound_key(*parts: str | int) -> str:
    """A state or partition key made of several fields, as a JSON array: unlike a separator ("a|b" + "c" vs
    "a" + "b|c"), no field value can make two different keys equal."""
    return orjson.dumps(parts).decode()

