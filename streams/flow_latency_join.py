"""Join a flow segment's sender (tx) and receiver (rx) samples into one-way latency.

Pure logic: no Kafka, no Faust. Whichever side arrives first waits in a
bounded table; the other side completes it. Raw clocks are used until a
clock estimate is supplied (see `ClockCorrection`).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Protocol

from clocktower.schemas.analytics import FlowLatency
from clocktower.schemas.telemetry import FlowSample

SegmentKey = tuple[str, str, int, int, str, int]


class ClockCorrection(Protocol):
    """Maps a node-local timestamp to the reference clock, with an error bound."""

    def to_reference(self, node: str, local_ns: int) -> tuple[int, int] | None: ...


class FlowLatencyJoin:
    """Pairs tx/rx samples by (5-tuple, seq). Unmatched halves are evicted oldest-first."""

    def __init__(self, max_pending: int = 500_000, clocks: ClockCorrection | None = None) -> None:
        self.max_pending = max_pending
        self.clocks = clocks
        self.pending: OrderedDict[SegmentKey, FlowSample] = OrderedDict()
        self.evicted = 0
        self.duplicates = 0

    @staticmethod
    def key(s: FlowSample) -> SegmentKey:
        return (s.src_ip, s.dst_ip, s.src_port, s.dst_port, s.proto, s.seq)

    def add(self, sample: FlowSample) -> FlowLatency | None:
        k = self.key(sample)
        other = self.pending.get(k)
        if other is None:
            self.pending[k] = sample
            if len(self.pending) > self.max_pending:
                self.pending.popitem(last=False)
                self.evicted += 1
            return None
        if other.direction == sample.direction:
            self.duplicates += 1   # a replayed half: keep the first one
            return None
        del self.pending[k]
        tx, rx = (other, sample) if other.direction == "tx" else (sample, other)
        return self._latency(tx, rx)

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
        )
