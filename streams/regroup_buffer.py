"""Regrouped events wait a little per destination partition, so a repartition record carries many input records'.

A telemetry record split by a processor's key goes to several partitions of its repartition topic: 880 flow records
made 4,781 repartition records in streams_scaling, each sent, read back and handled on its own, at a fixed cost a
record whatever its events (issue 19). Here the parts of consecutive input records that go to one partition are
joined, up to `max_events`, for at most `linger_s` (as a Kafka producer's linger.ms): under load a record carries
hundreds of events; at a trickle each part still goes out within `linger_s`.

What waits here is, like the write-back's pending state, sent before the offsets of the records it came from are
committed (streams/engine/write_back.py), and dropped when partitions are revoked (those records are read again).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from clocktower.schemas.event import Event

Part = tuple[str, int, list[Event]]   # repartition topic, partition, events


class RegroupBuffer:
    def __init__(self, linger_s: float, max_events: int = 1000, clock: Callable[[], float] = time.monotonic) -> None:
        self.linger_s = linger_s
        self.max_events = max_events
        self.clock = clock
        self._parts: dict[tuple[str, int], list[Event]] = {}
        self._since: dict[tuple[str, int], float] = {}   # when each waiting part got its first event

    def add(self, topic: str, partition: int, events: Sequence[Event]) -> list[Part]:
        """Queue `events` for `topic`/`partition`; the part, if it is now full."""
        where = (topic, partition)
        part = self._parts.get(where)
        if part is None:
            part = self._parts[where] = []
            self._since[where] = self.clock()
        part.extend(events)
        if len(part) < self.max_events:
            return []
        del self._parts[where], self._since[where]
        return [(topic, partition, part)]

    def due(self) -> list[Part]:
        """The parts that have waited `linger_s` or more."""
        if not self._since:
            return []
        cutoff = self.clock() - self.linger_s
        ready = [where for where, since in self._since.items() if since <= cutoff]
        return [self._take(where) for where in ready]

    def drain(self) -> list[Part]:
        """Every waiting part (before a commit)."""
        return [self._take(where) for where in list(self._parts)]

    def drop(self) -> int:
        """Forget every waiting event (partitions revoked: their records are read again); how many."""
        n = sum(len(p) for p in self._parts.values())
        self._parts.clear()
        self._since.clear()
        return n

    def __len__(self) -> int:
        return sum(len(p) for p in self._parts.values())

    def _take(self, where: tuple[str, int]) -> Part:
        del self._since[where]
        return (*where, self._parts.pop(where))
