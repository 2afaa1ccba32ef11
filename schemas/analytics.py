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
    Sequence,
    Text,
    TimestampNs,
    UInt8,
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
    seq: Sequence
    bytes: UInt64
    tx_ns: TimestampNs
    rx_ns: TimestampNs
    latency_ns: Int64 = Field(description="rx_ns - tx_ns on the raw clocks, ns")
    clock_corrected: Bool
    corrected_latency_ns: Int64 | None = Field(description="latency with both clocks corrected, ns")
    error_bound_ns: Int64 | None = Field(description="bound on the corrected latency's error, ns")
    priority: UInt8 | None = Field(None, description="the sender's skb priority (traffic class) for the segment; "
                                                     "null = unknown (and in rows written before this column "
                                                     "existed)")


class ClockEstimate(Event):
    """A node's clock against the reference: local = reference + offset."""

    SCHEMA = "clock_estimate"

    reference: Name
    offset_ns: Int64
    drift_ppb: Float64
    error_bound_ns: Int64
    drift_std_ppb: Float64 = Field(0.0, description="standard deviation of drift_ppb, ppb; 0 for the reference "
                                                    "(and in rows written before this column existed)")
    offset_frac_ns: Float64 = Field(0.0, description="offset_ns's rounding remainder (at most 0.5): the offset is "
                                                     "offset_ns + offset_frac_ns, ns; 0 in rows written before this "
                                                     "column existed")
    solve_nodes: UInt32 = Field(0, description="how many estimates the solve published (all with this ts_ns), so "
                                               "a reader knows when it has all of them; 0 = unknown (rows written "
                                               "before this column existed)")
    held_ns: Int64 = Field(0, description="0 for an estimate the solve made; else how long ago the node's last "
                                          "solved estimate was, which this one carries forward along its drift, "
                                          "its bound widened, because none of the node's edges had a fresh "
                                          "unqueued probe (congestion into the node)")


class ClockEdgeFit(Event):
    """One probe-graph edge's clock fit: the per-edge level of clock sync, read by the network solve.

    `node` is the edge's lo end and `hi` its other end (lo < hi as strings). Delta(t) = hi's clock - lo's
    = offset_ns + drift_ppb t + curvature t^2, t in s of lo's clock from `ts_ns` (the fit's origin, on the
    fitter's probe time), fitted jointly with the one-way delay floor from both directions' pure probe pairs
    (streams/clocksync/pair_fit.py). Sample times are relative to `ts_ns` in s (negative: before it).
    """

    SCHEMA = "clock_edge_fit"
    ORDER_BY = ("node", "hi", "ts_ns")

    hi: Name = Field(description="the edge's other end (its name sorts after `node`)")
    delay_ns: Float64 = Field(description="one-way delay floor D, ns (the same both ways, by assumption)")
    offset_ns: Float64 = Field(description="c: hi's clock minus node's at ts_ns, ns")
    drift_ppb: Float64 = Field(description="b: d(offset)/dt at ts_ns, ns/s = ppb")
    curvature_ns_per_s2: Float64 = Field(description="a: the quadratic term (half the drift's rate), ns/s^2")
    cov: list[Float64] = Field(max_length=16, description="covariance of (D, c, b, a), 4x4 row-major, units of "
                                                          "their products; [] when not valid")
    sigma_ns: Float64 = Field(description="residual spread of the fit's floor core (timestamp noise), ns")
    n_fwd: UInt32 = Field(description="core samples node -> hi")
    n_rev: UInt32 = Field(description="core samples hi -> node")
    t_first_s: Float64 = Field(description="earliest sample, s relative to ts_ns")
    t_last_fwd_s: Float64 | None = Field(description="latest sample node -> hi, s relative to ts_ns; null = none")
    t_last_rev_s: Float64 | None = Field(description="latest sample hi -> node, s relative to ts_ns; null = none")
    valid: Bool = Field(description="enough core samples in both directions over a long enough span to use")


class IterationBreakdown(Event):
    """Where one rank's iteration went: compute vs collective communication."""

    SCHEMA = "iteration_breakdown"
    ORDER_BY = ("job", "rank", "iteration", "start_ns")
    REPLACING = True

    job: Name
    rank: UInt32
    iteration: Sequence
    start_ns: TimestampNs
    end_ns: TimestampNs
    duration_ns: DurationNs
    comm_ns: DurationNs
    compute_ns: DurationNs
    collectives: UInt32
    comm_bytes: UInt64
    gpu: UInt8 | None = Field(None, description="the rank's device index on its node, from its iterations; null = "
                                                "unknown (and in rows written before this column existed)")
    world_size: UInt32 | None = Field(None, description="the job's ranks, from its iterations; null = unknown (and "
                                                        "in rows written before this column existed)")


Blame = Literal["link", "congestion", "gpu", "host", "none"]


class IterationBlame(Event):
    """Why one iteration of a job took as long as it did: the rank everyone waited for, and the cause.

    One row per job and iteration, once its ranks' breakdowns are in (`node` is the slowest rank's node).
    `blame`: "gpu" (the slowest rank's GPU has a fault incident open), "host" (that rank computes slowly on a
    healthy GPU), "link" (communication slow while a link incident is open on one of the job's nodes),
    "congestion" (... a congestion incident), "none" (not slow, or slow with no cause found; `evidence` says
    which). `evidence` is a JSON object: the figures and the incident ids behind the verdict.
    """

    SCHEMA = "iteration_blame"
    ORDER_BY = ("job", "iteration")
    REPLACING = True

    job: Name
    iteration: Sequence
    start_ns: TimestampNs = Field(description="the earliest rank's start, on its node's clock")
    duration_ns: DurationNs = Field(description="the longest rank's iteration")
    baseline_ns: DurationNs = Field(description="the job's typical iteration (EWMA of its iterations not slow)")
    slowdown: Float64 = Field(description="duration_ns / baseline_ns")
    ranks: UInt32 = Field(description="ranks whose breakdown was in")
    slowest_rank: UInt32 = Field(description="the rank that computed longest: the one the others waited for")
    slowest_gpu: UInt8 | None = Field(description="its GPU (device index on `node`); null = unknown")
    slowest_compute_ns: DurationNs
    median_compute_ns: DurationNs
    median_comm_ns: DurationNs
    blame: Blame
    evidence: Text = ""


IncidentKind = Literal[
    "link_flap", "link_down", "link_quarantine", "link_blip", "congestion", "gpu_thermal", "gpu_xid", "gpu_ecc",
    "gpu_lost", "straggler", "node_silent",
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
    command_ids: list[str] = Field(default_factory=list, max_length=64,
                                   description="ids of the control commands this incident caused, in order")
    evidence: Text = Field("", description="the figures behind this row, as a JSON object (the detector's readings "
                                           "and thresholds); \"\" = none (and in rows written before this column "
                                           "existed)")
