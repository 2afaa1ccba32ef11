"""What one detector entry remembers so that a redelivered event changes nothing and loses nothing.

A worker killed before it commits replays its last uncommitted records over state that already saw them,
and the outputs of those records may or may not have been published before it died (the state's changelog
and the output topics are written separately). So an event whose `ts_ns` the entry has applied is not applied
again, and if it emitted something the same outputs come back (same incident and command ids, so consumers
collapse the copies): a failover lost in the crash is still sent, a spurious one is never invented.

Three rules decide, in this order (issue 18, finding 4, and two reviews):
- **A replay**, by position (`Delivery`: the record's topic, partition and offset, and the event's index in
  the record's batch): a worker killed before its commit reads the same offsets again, and the entry keeps the
  last position it applied per topic-partition. An event at or before it, and not newer than anything applied
  (a topic recreated from offset 0 brings newer events), was applied: its outputs come back by position.
- **A copy**: an event whose `ts_ns` the entry applied (the newest `SEEN` times are kept). A node's signature
  proves who sent a record, not when, so anyone who can write the topic can publish a captured record again,
  at a new offset; it changes nothing, and its outputs come back (same ids).
- **Stale**: an event more than `STALE_NS` older than the newest applied one, or, once `SEEN` times are kept,
  older than all of them (a GPU reads 10 times a second: a copy of a reading of 2 s ago is no longer among
  them). One key's readings may come slightly out of order (an XID reading races the periodic one of its GPU):
  within the newest `SEEN`, such an event is applied.

A record dated ahead (up to CLOCKTOWER_MAX_FUTURE_SKEW_S, 30 s) by someone who holds the node's key can still
make that node's periodic readings look stale until real time catches up with it. A reading that reports a fault
(`fault=True`: an XID, a lost GPU) is spared the `SEEN` part of the stale rule, so it is applied unless it is a
replay, a copy, or more than `STALE_NS` (twice the skew) older than the newest: a record dated ahead can delay
what periodic readings show, never hide a fault (eight GPU readings dated 23 h ahead once hid a real XID 79 for a
day). Without a position (the in-memory pipeline of the tests) the last two rules decide.
"""

from __future__ import annotations

import bisect
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

import orjson

from clocktower.control.intent import CommandIntent
from clocktower.schemas.analytics import Incident
from clocktower.schemas.control import ReplacementRequest
from clocktower.streams.delivery import Delivery

T = TypeVar("T")

SEEN = 16      # applied timestamps kept per entry (and within STALE_NS of the newest): how far out of order
               # a reading may come, and how far back a copy is recognised as one
STALE_NS = 60 * 10**9   # an event this much older than the newest applied is not applied: twice the default
                        # future skew, so a record dated ahead cannot make a real fault stale
EMITTED = 4    # newest emissions kept per entry: how many of a key's outputs a replay can send again
SOURCES = 4    # topic-partitions remembered per entry (one, unless the topic's partitions were changed)

Emitted = list[Incident | CommandIntent | ReplacementRequest]


@dataclass
class DeliveryLog:
    seen: list[int] = field(default_factory=list)                      # applied ts_ns, ascending
    emitted: list[tuple[int, Delivery | None, Emitted]] = field(default_factory=list)   # oldest first
    upto: dict[str, tuple[int, int]] = field(default_factory=dict)     # source -> last applied (offset, index)

    @property
    def newest(self) -> int:
        return self.seen[-1] if self.seen else 0

    def was_applied(self, ts_ns: int, at: Delivery | None = None, fault: bool = False) -> bool:
        """Whether the event at `ts_ns`, read at `at`, must not be applied: a replay, a copy, or stale (see the
        module doc for `fault`)."""
        if self.replayed(ts_ns, at) or self._seen(ts_ns) or ts_ns < self.newest - STALE_NS:
            return True
        return not fault and len(self.seen) >= SEEN and ts_ns < self.seen[0]

    def replayed(self, ts_ns: int, at: Delivery | None) -> bool:
        """Read again at a position already applied (a restart after a kill)."""
        if at is None or ts_ns > self.newest:
            return False
        last = self.upto.get(at.source)
        return last is not None and (at.offset, at.index) <= last

    def _seen(self, ts_ns: int) -> bool:
        i = bisect.bisect_left(self.seen, ts_ns)
        return i < len(self.seen) and self.seen[i] == ts_ns

    def applied(self, ts_ns: int, outputs: Emitted, at: Delivery | None = None) -> None:
        """Note that the event at `ts_ns`, read at `at`, was applied and emitted `outputs`."""
        bisect.insort(self.seen, ts_ns)
        floor = self.seen[-1] - STALE_NS
        del self.seen[:max(len(self.seen) - SEEN, bisect.bisect_left(self.seen, floor))]
        if at is not None:
            self.upto.pop(at.source, None)     # re-inserted last: the oldest source is the first to go
            self.upto[at.source] = (at.offset, at.index)
            while len(self.upto) > SOURCES:
                del self.upto[next(iter(self.upto))]
        if outputs:
            self.emitted.append((ts_ns, at, list(outputs)))
            del self.emitted[:-EMITTED]

    def outputs_of(self, ts_ns: int, at: Delivery | None = None) -> Emitted:
        """What a replay must publish again: what the event emitted when it was applied, if still remembered, else
        []. A copy or a stale event read at a new position gets [] (its original's outputs were published when
        that was applied; sent again, an old "open" would overwrite a later "resolve"). Without a position: by
        time, as a replay."""
        if at is None:
            return next((list(out) for ts, _, out in self.emitted if ts == ts_ns), [])
        if not self.replayed(ts_ns, at):
            return []
        return next((list(out) for ts, pos, out in self.emitted if pos == at and ts == ts_ns), [])

    def to_dict(self) -> dict[str, Any]:
        return {"seen": self.seen, "upto": self.upto,
                "emitted": [[ts, pos and list(pos), [encode_output(o) for o in out]] for ts, pos, out in self.emitted]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DeliveryLog:
        """Also reads the entries of versions before positions: `emitted` as [ts, outputs], no `upto`."""
        emitted = [(e[0], Delivery(*e[1]) if len(e) == 3 and e[1] else None, [decode_output(o) for o in e[-1]])
                   for e in d["emitted"]]
        return cls(d["seen"], emitted, {s: (o, i) for s, (o, i) in d.get("upto", {}).items()})


def encode_output(o: Incident | CommandIntent | ReplacementRequest) -> dict[str, Any]:
    """One output as plain JSON data (decode_output reverses it)."""
    if isinstance(o, CommandIntent):
        return {"intent": asdict(o)}
    return {"replacement" if isinstance(o, ReplacementRequest) else "incident": o.model_dump()}


def decode_output(d: dict[str, Any]) -> Incident | CommandIntent | ReplacementRequest:
    if "intent" in d:
        return CommandIntent(**d["intent"])
    if "replacement" in d:
        return ReplacementRequest.model_construct(**d["replacement"])
    return Incident.model_construct(**d["incident"])


def encode_entry(value: Any) -> bytes:
    """A detector's state entry (a dataclass with a `log: DeliveryLog` field) as JSON."""
    return orjson.dumps({**vars(value), "log": value.log.to_dict()})


def decode_entry(cls: type[T], data: bytes) -> T:
    d = orjson.loads(data)
    return cls(**{**d, "log": DeliveryLog.from_dict(d["log"])})
