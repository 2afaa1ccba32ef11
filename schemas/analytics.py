"""Events derived by the stream processors."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from clocktower.schemas.column_types import (
    Bool,
    DurationNs,
    Float64,
    Int64,
    Name,
    Text,
    TimestampNs,
    UInt16,
    UInt32,
    UInt64,
)
from clocktower.schemas.event import Event
from clocktower.schemas.telemetry import Protocol


class FlowLatency(Event):
    """One-way latency of one flow segment; `node` is the receiver.

    `latency_ns` uses raw clocks. `corrected_latency_ns` and `error_bound_ns`
    are set only when a clock estimate existed for both ends (`clock_corrected`),
    and null otherwise; all three are required, so a producer must say which.
    """

    SCHEMA = "flow_latency"
    ORDER_BY = ("src_ip", "dst_ip", "src_port", "dst_port", "proto", "seq", "tx_ns")
    REPLACING = True

    src_node: Name
    src_ip: Name
    dst_ip: Name
    src_port: UInt16
    dst_port: UInt16
    proto: Protocol
    seq: UInt64
    bytes: UInt64
    tx_ns: TimestampNs
    rx_ns: TimestampNs
    latency_ns: Int64 = Field(description="rx_ns - tx_ns on the raw clocks, ns")
    clock_corrected: Bool
    corrected_latency_ns: Int64 | None = Field(description="latency with both clocks corrected, ns")
    error_bound_ns: Int64 | None = Field(description="bound on the corrected latency's error, ns")


class ClockEstimate(Event):
    """A node's clock against the reference: local = reference + offset."""

    SCHEMA = "clock_estimate"

    reference: Name
    offset_ns: Int64
    drift_ppb: Float64
    error_bound_ns: Int64


class IterationBreakdown(Event):
    """Where one rank's iteration went: compute vs collective communication."""

    SCHEMA = "iteration_breakdown"
    ORDER_BY = ("job", "rank", "iteration", "start_ns")
    REPLACING = True

    job: Name
    rank: UInt32
    iteration: UInt64
    start_ns: TimestampNs
    end_ns: TimestampNs
    duration_ns: DurationNs
    comm_ns: DurationNs
    compute_ns: DurationNs
    collectives: UInt32
    comm_bytes: UInt64


IncidentKind = Literal[
    "link_flap", "congestion", "gpu_thermal", "gpu_xid", "gpu_ecc", "gpu_lost", "straggler"
]


class Incident(Event):
    """A detected problem. One incident id goes open -> (update)* -> resolve. `detail` is free text ("" = none)."""

    SCHEMA = "incident"
    ORDER_BY = ("incident_id", "state", "ts_ns")
    REPLACING = True

    incident_id: Name
    kind: IncidentKind
    state: Literal["open", "update", "resolve"]
    severity: Literal["info", "warning", "critical"]
    target: Name
    opened_ns: TimestampNs
    detail: Text = ""
