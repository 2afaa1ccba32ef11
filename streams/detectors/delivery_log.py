"""What one detector entry remembers so that a redelivered event changes nothing and loses nothing.

A worker killed before it commits replays its last uncommitted records over state that already saw them,
and the outputs of those records may or may not have been published before it died (the state's changelog
and the output topics are written separately). So an event whose `ts_ns` the entry has applied is not applied
again, and if it emitted something the same outputs come back (same incident and command ids, so consumers
collapse the copies): a failover lost in the crash is still sent, a spurious one is never invented.

Redelivery is told by where the event came from (`Delivery`: its record's topic, partition and offset, and
its index in the record's batch), not by its time: a replay reads the same offsets again, and the entry keeps
the last position it applied per topic-partition. So an event at a later position is new whatever its
`ts_ns` says, and a record dated ahead cannot make a node's real readings look already seen (issue 18,
finding 4: eight GPU readings dated 23 h ahead once hid a real XID 79 for a day).

The applied timestamps are still kept, the newest `SEEN` of them, for two uses. An event at or before the
last position must also carry a timestamp the entry applied (or one older than all of a full memory) to
count as seen, so a topic recreated from offset 0 does not blind an entry that outlived it. And without a
position (the in-memory pipeline of the tests and benchmarks) the timestamps alone decide: an event not
among them and newer than the oldest is new (one key's readings can arrive slightly out of order: an XID
reading races the periodic one of the same GPU).
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

SEEN = 8       # newest applied timestamps kept per entry: how far out of order a reading may come
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

    def was_applied(self, ts_ns: int, at: Delivery | None = None) -> bool:
        """Whether the event at `ts_ns`, read at `at`, was applied already (a replay), so must not be again."""
        if at is not None:
            last = self.upto.get(at.source)
            if last is None or (at.offset, at.index) > last:
                return False          # a position past the last applied: new, whatever its time says
        if len(self.seen) >= SEEN and ts_ns < self.seen[0]:
            return True
        i = bisect.bisect_left(self.seen, ts_ns)
        return i < len(self.seen) and self.seen[i] == ts_ns

    def applied(self, ts_ns: int, outputs: Emitted, at: Delivery | None = None) -> None:
        """Note that the event at `ts_ns`, read at `at`, was applied and emitted `outputs`."""
        bisect.insort(self.seen, ts_ns)
        del self.seen[:-SEEN]
        if at is not None:
            self.upto.pop(at.source, None)     # re-inserted last: the oldest source is the first to go
            self.upto[at.source] = (at.offset, at.index)
            while len(self.upto) > SOURCES:
                del self.upto[next(iter(self.upto))]
        if outputs:
            self.emitted.append((ts_ns, at, list(outputs)))
            del self.emitted[:-EMITTED]

    def outputs_of(self, ts_ns: int, at: Delivery | None = None) -> Emitted:
        """What the event read at `at` (without one: the event at `ts_ns`) emitted, if still remembered; else []."""
        if at is not None:
            return next((list(out) for _, pos, out in self.emitted if pos == at), [])
        return next((list(out) for ts, _, out in self.emitted if ts == ts_ns), [])

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
