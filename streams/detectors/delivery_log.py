"""What one detector entry remembers so that a redelivered event changes nothing and loses nothing.

A worker killed before it commits replays its last uncommitted records over state that already saw them,
and the outputs of those records may or may not have been published before it died (the state's changelog
and the output topics are written separately). So an event whose `ts_ns` the entry has applied is not applied
again, and if it emitted something the same outputs come back (same incident and command ids, so consumers
collapse the copies): a failover lost in the crash is still sent, a spurious one is never invented.

One key's readings can arrive slightly out of order (an XID reading races the periodic one of the same GPU),
so the newest `SEEN` timestamps are kept, not only the last: an event not among them and newer than the
oldest is new. Once the memory is full, an event older than all of them counts as seen: replayed from further
back, or later than `SEEN` newer readings of its key; either way it is not applied. A node clock that steps
back by D makes that node's readings look seen for D.
"""

from __future__ import annotations

import bisect
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

import orjson

from clocktower.control.intent import CommandIntent
from clocktower.schemas.analytics import Incident
from clocktower.schemas.control import ReplacementRequest

T = TypeVar("T")

SEEN = 8       # newest applied timestamps kept per entry: how far out of order a reading may come
EMITTED = 4    # newest emissions kept per entry: how many of a key's outputs a replay can send again

Emitted = list[Incident | CommandIntent | ReplacementRequest]


@dataclass
class DeliveryLog:
    seen: list[int] = field(default_factory=list)                      # applied ts_ns, ascending
    emitted: list[tuple[int, Emitted]] = field(default_factory=list)   # (ts_ns, outputs), oldest first

    @property
    def newest(self) -> int:
        return self.seen[-1] if self.seen else 0

    def was_applied(self, ts_ns: int) -> bool:
        if len(self.seen) >= SEEN and ts_ns < self.seen[0]:
            return True
        i = bisect.bisect_left(self.seen, ts_ns)
        return i < len(self.seen) and self.seen[i] == ts_ns

    def applied(self, ts_ns: int, outputs: Emitted) -> None:
        """Note that the event at `ts_ns` was applied and emitted `outputs`."""
        bisect.insort(self.seen, ts_ns)
        del self.seen[:-SEEN]
        if outputs:
            self.emitted.append((ts_ns, list(outputs)))
            del self.emitted[:-EMITTED]

    def outputs_of(self, ts_ns: int) -> Emitted:
        """What the event at `ts_ns` emitted, if it is still remembered; [] otherwise."""
        return next((list(out) for ts, out in self.emitted if ts == ts_ns), [])

    def to_dict(self) -> dict[str, Any]:
        return {"seen": self.seen, "emitted": [[ts, [encode_output(o) for o in out]] for ts, out in self.emitted]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DeliveryLog:
        return cls(d["seen"], [(ts, [decode_output(o) for o in out]) for ts, out in d["emitted"]])


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
