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
expire on arrival); a half that expires unjoined is counted. Raw clocks are used until a clock estimate is
at hand (ClockCorrection).
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol

import orjson

from clocktower.schemas.analytics import FlowLatency
from clocktower.schemas.event import Event
from clocktower.schemas.telemetry import FlowSample
from clocktower.streams.processor import Output, Processor, compound_key
from clocktower.streams.processor_context import ProcessorContext

DEFAULT_SEGMENT_TTL_NS = 10 * 10**9


class ClockCorrection(Protocol):
    """Maps a node-local timestamp to the reference clock, with an error bound."""

    def to_reference(self, node: str, local_ns: int) -> tuple[int, int] | None: ...


Segment = dict[str, FlowSample]   # "tx" / "rx" -> the half


def flow_key(s: FlowSample) -> str:
    return compound_key(s.src_ip, s.dst_ip, s.src_port, s.dst_port, s.proto)


class FlowLatencyJoin(Processor):
    name: ClassVar[str] = "flow_latency"
    consumes: ClassVar[tuple[type[Event], ...]] = (FlowSample,)
    key_by: ClassVar[str] = "segment 5-tuple"

    def __init__(self, clocks: ClockCorrection | None = None, ttl_ns: int = DEFAULT_SEGMENT_TTL_NS) -> None:
        self.clocks = clocks
        self.state_ttl_ns = ttl_ns
        self.duplicates = 0        # a half seen again while its segment waits: the first one is kept
        self.expired_halves = 0    # halves whose other end never came within the TTL
        self.reused_keys = 0       # a half with the key of a completed segment but another time: a new one

    @classmethod
    def from_context(cls, ctx: ProcessorContext) -> FlowLatencyJoin:
        return cls(ctx.clocks, ctx.segment_ttl_ns)

    def partition_key(self, event: Event) -> str:
        assert isinstance(event, FlowSample)
        return flow_key(event)

    def process(self, state: Any, event: Event) -> list[Output]:
        assert isinstance(event, FlowSample)
        key = compound_key(event.src_ip, event.dst_ip, event.src_port, event.dst_port, event.proto, event.seq)
        seg: Segment | None = state.get(key)
        if seg is None:
            seg = {event.direction: event}
            state.put(key, seg, self._expires(seg, state.now_ns))
            return []
        if event.direction in seg:
            if len(seg) == 2 and seg[event.direction].ts_ns != event.ts_ns:
                # Not a copy of a completed segment: the key came round again (a sender's seq restarted).
                self.reused_keys += 1
                seg = {event.direction: event}
                state.put(key, seg, self._expires(seg, state.now_ns))
                return []
            if len(seg) == 2:   # redelivered after its segment completed: the same result again
                return [self._latency(seg["tx"], seg["rx"])]
            self.duplicates += 1
            return []
        seg[event.direction] = event
        state.put(key, seg, self._expires(seg, state.now_ns))
        return [self._latency(seg["tx"], seg["rx"])]

    def _expires(self, seg: Segment, now_ns: int) -> int:
        """TTL after the first half, or after the partition's time if that is later: a half stamped by a clock
        far behind the others' (clock sync exists to fix those) must not expire the moment it arrives."""
        return max(min(s.ts_ns for s in seg.values()), now_ns) + self.state_ttl_ns

    def on_expired(self, expired: list[tuple[str, Any]]) -> list[Output]:
        self.expired_halves += sum(1 for _, seg in expired if seg is not None and len(seg) == 1)
        return []

    def counters(self) -> dict[str, int]:
        return {"duplicate_halves": self.duplicates, "expired_halves": self.expired_halves,
                "reused_keys": self.reused_keys}

    def encode_state(self, value: Segment) -> bytes:
        return orjson.dumps({d: s.model_dump() for d, s in value.items()})

    def decode_state(self, data: bytes) -> Segment:
        return {d: FlowSample.model_construct(**s) for d, s in orjson.loads(data).items()}

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
