"""Join a flow segment's sender (tx) and receiver (rx) samples into one-way latency.

Keyed by the segment's 5-tuple, so a flow's two ends, reported by two nodes, meet on one worker. The
state entry of a segment (5-tuple and seq, a JSON array: no separator to collide) holds whichever half
came first; the other half completes it.
A completed entry keeps both halves until it expires, so a half redelivered after a crash (its output may
not have been written when the worker died) re-emits the same latency instead of waiting forever as a
new half: the table of results is a ReplacingMergeTree, and the copy collapses. A copy has the same
timestamp; a half with the key of a completed segment but another timestamp starts a new segment (a sender
whose seq restarted, e.g. a new run), while a second half for a waiting one is a duplicate (the first kept).
An entry expires `state_ttl_ns` of event time (default 10 s, CLOCKTOWER_STREAMS_SEGMENT_TTL_S) after its
first half, or after the partition's time when that is later (a half from a clock far behind must not
expire on arrival); a half that expires unjoined is counted.

Waiting for the clock (issue 20): a segment completed before the clock estimates that follow its two timestamps
have come (ClockCorrection.awaits: the estimates come a solve and two Kafka hops after the probes) is held, not
published: converting it then would extrapolate the offsets, or fail. It is published as soon as both ends'
estimates cover it, or after `wait_ns` (CLOCKTOWER_STREAMS_CLOCK_WAIT_S, default 3 s), whichever comes first, on
either clock: the partition's event time (the entry's expiry: so a held segment survives a crash in the table, and
its new owner picks it up from the table: `restored`) or the worker's own (the worker ticks partitions with held
segments on a timer even when no record comes: `due_partitions`). Then it is converted with whatever estimate there
is, or not at all.
With no clock probes at all, every row comes `wait_ns` late: set 0 to never wait.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import orjson

from clocktower.schemas.analytics import FlowLatency
from clocktower.schemas.event import Event
from clocktower.schemas.telemetry import FlowSample
from clocktower.streams.processor import Output, Processor, compound_key
from clocktower.streams.processor_context import ProcessorContext

log = logging.getLogger(__name__)
DEFAULT_SEGMENT_TTL_NS = 10 * 10**9
DEFAULT_CLOCK_WAIT_NS = 3 * 10**9
_HELD = b'"held":true'   # how encode_state marks a held segment


class ClockCorrection(Protocol):
    """Maps a node-local timestamp to the reference clock, with an error bound."""

    def to_reference(self, node: str, local_ns: int) -> tuple[int, int] | None: ...

    def awaits(self, node: str, local_ns: int) -> bool:
        """Whether an estimate made after `local_ns` may still come (streams/clocksync/clock_view.py)."""
        ...


@dataclass
class Segment:
    halves: dict[str, FlowSample]   # "tx" / "rx" -> the half
    held: bool = False              # complete, waiting for the clock estimates that follow it


def flow_key(s: FlowSample) -> str:
    return compound_key(s.src_ip, s.dst_ip, s.src_port, s.dst_port, s.proto)


class FlowLatencyJoin(Processor):
    name: ClassVar[str] = "flow_latency"
    consumes: ClassVar[tuple[type[Event], ...]] = (FlowSample,)
    key_by: ClassVar[str] = "segment 5-tuple"

    def __init__(self, clocks: ClockCorrection | None = None, ttl_ns: int = DEFAULT_SEGMENT_TTL_NS,
                 wait_ns: int = 0, wall: Callable[[], float] = time.monotonic) -> None:
        """`wait_ns`: how long a completed segment may wait for its clock estimates (0: never waits)."""
        self.clocks = clocks
        self.state_ttl_ns = ttl_ns
        self.wait_ns = wait_ns
        self.wall = wall
        self._held: dict[int, dict[str, float]] = {}   # partition -> held key -> the worker's deadline (wall)
        self.duplicates = 0        # a half seen again while its segment waits: the first one is kept
        self.expired_halves = 0    # halves whose other end never came within the TTL
        self.reused_keys = 0       # a half with the key of a completed segment but another time: a new one
        self.held = 0              # segments held for their clock estimates
        self.held_to_bound = 0     # of those, published at the bound, the estimates still to come
        self.publish_errors = 0    # held segments that could not be converted when due (logged)

    @classmethod
    def from_context(cls, ctx: ProcessorContext) -> FlowLatencyJoin:
        return cls(ctx.clocks, ctx.segment_ttl_ns, ctx.clock_wait_ns if ctx.clocks is not None else 0)

    def partition_key(self, event: Event) -> str:
        assert isinstance(event, FlowSample)
        return flow_key(event)

    def process(self, state: Any, event: Event) -> list[Output]:
        assert isinstance(event, FlowSample)
        key = compound_key(event.src_ip, event.dst_ip, event.src_port, event.dst_port, event.proto, event.seq)
        seg: Segment | None = state.get(key)
        if seg is None:
            seg = Segment({event.direction: event})
            state.put(key, seg, self._expires(seg, state.now_ns))
            return []
        halves = seg.halves
        if event.direction in halves:
            if len(halves) == 2 and halves[event.direction].ts_ns != event.ts_ns:
                # Not a copy of a completed segment: the key came round again (a sender's seq restarted). One still
                # held is published now, with the estimates there are: it must not be lost with its entry.
                self.reused_keys += 1
                out = [self._latency(halves["tx"], halves["rx"])] if seg.held else []
                self._held.get(state.partition, {}).pop(key, None)
                seg = Segment({event.direction: event})
                state.put(key, seg, self._expires(seg, state.now_ns))
                return out
            if len(halves) == 2:   # redelivered after its segment completed: the same result again (once published)
                return [] if seg.held else [self._latency(halves["tx"], halves["rx"])]
            self.duplicates += 1
            return []
        halves[event.direction] = event
        if self._waits(seg):
            seg.held = True
            self.held += 1
            state.put(key, seg, state.now_ns + self.wait_ns, capped=False)
            self._held.setdefault(state.partition, {})[key] = self.wall() + self.wait_ns / 1e9
            return []
        state.put(key, seg, self._expires(seg, state.now_ns))
        return [self._latency(halves["tx"], halves["rx"])]

    def _waits(self, seg: Segment) -> bool:
        """Whether a complete segment should wait: an estimate that follows one of its timestamps may still come."""
        if self.clocks is None or self.wait_ns <= 0:
            return False
        tx, rx = seg.halves["tx"], seg.halves["rx"]
        return self.clocks.awaits(tx.node, tx.ts_ns) or self.clocks.awaits(rx.node, rx.ts_ns)

    def _expires(self, seg: Segment, now_ns: int) -> int:
        """TTL after the first half, or after the partition's time if that is later: a half stamped by a clock
        far behind the others' (clock sync exists to fix those) must not expire the moment it arrives."""
        return max(min(s.ts_ns for s in seg.halves.values()), now_ns) + self.state_ttl_ns

    def _publish(self, state: Any, key: str, seg: Segment, out: list[Output]) -> None:
        """A held segment's latency, with the estimates there are now, onto `out`; it is kept as a completed one.
        One that cannot be converted is logged and counted (`publish_errors`), and the others go on: a tick's
        outputs are only published if it returns, so one bad entry must not take the others' rows with it."""
        try:
            row = self._latency(seg.halves["tx"], seg.halves["rx"])
        except Exception:  # noqa: BLE001 - see above
            self.publish_errors += 1
            if self.publish_errors <= 10 or self.publish_errors % 1000 == 0:
                log.exception("held segment %s could not be published (%d so far)", key[:200], self.publish_errors)
            return
        seg.held = False
        state.put(key, seg, self._expires(seg, state.now_ns), capped=False)
        out.append(row)

    def tick(self, state: Any, now_ns: int) -> list[Output]:
        """Publishes the held segments of this partition whose estimates came, or whose wait is over (either clock),
        then expires old entries."""
        out: list[Output] = []
        held = self._held.get(state.partition)
        if held:
            wall = self.wall()
            for key, until in list(held.items()):
                seg = state.get(key)
                if seg is None or not seg.held:
                    del held[key]
                elif wall >= until or not self._waits(seg):
                    self.held_to_bound += wall >= until and self._waits(seg)
                    self._publish(state, key, seg, out)
                    del held[key]
        for key, seg in state.expire(now_ns):
            if seg is None:
                continue
            if seg.held:   # its wait is over in event time (or it was held by this partition's last owner)
                self.held_to_bound += self._waits(seg)
                self._publish(state, key, seg, out)
                if held:
                    held.pop(key, None)
            elif len(seg.halves) == 1:
                self.expired_halves += 1
        return out

    def due_partitions(self) -> Collection[int]:
        return [p for p, held in self._held.items() if held]

    def revoked(self) -> None:
        self._held.clear()   # their entries stay held in the table: `restored` picks them up again

    def restored(self, partition: int, key: str, data: bytes) -> None:
        """A held segment recovered from the table (its last owner died, or the partitions moved) waits again, at
        most `wait_ns` of this worker's clock: its partition may see no later record to expire it in event time."""
        if self.wait_ns > 0 and _HELD in data:   # (a name inside a JSON string has its quotes escaped: no match)
            self._held.setdefault(partition, {})[key] = self.wall() + self.wait_ns / 1e9

    def counters(self) -> dict[str, int]:
        return {"duplicate_halves": self.duplicates, "expired_halves": self.expired_halves,
                "reused_keys": self.reused_keys, "held_for_clock": self.held, "held_to_bound": self.held_to_bound,
                "publish_errors": self.publish_errors}

    def encode_state(self, value: Segment) -> bytes:
        doc: dict[str, Any] = {d: s.model_dump() for d, s in value.halves.items()}
        if value.held:
            doc["held"] = True
        return orjson.dumps(doc)

    def decode_state(self, data: bytes) -> Segment:
        doc = orjson.loads(data)
        held = bool(doc.pop("held", False))
        return Segment({d: FlowSample.model_construct(**s) for d, s in doc.items()}, held)

    def _latency(self, tx: FlowSample, rx: FlowSample) -> FlowLatency:
        corrected = bound = None
        if self.clocks is not None:
            t = self.clocks.to_reference(tx.node, tx.ts_ns)
            r = self.clocks.to_reference(rx.node, rx.ts_ns)
            if t is not None and r is not None:
                corrected, bound = r[0] - t[0], r[1] + t[1]
        return FlowLatency.model_construct(
            node=rx.node, ts_ns=rx.ts_ns, src_node=tx.node, src_ip=tx.src_ip, dst_ip=tx.dst_ip,
            src_port=tx.src_port, dst_port=tx.dst_port, proto=tx.proto, seq=tx.seq, bytes=tx.bytes,
            tx_ns=tx.ts_ns, rx_ns=rx.ts_ns, latency_ns=rx.ts_ns - tx.ts_ns,
            clock_corrected=corrected is not None, corrected_latency_ns=corrected, error_bound_ns=bound,
            priority=tx.priority,
        )
