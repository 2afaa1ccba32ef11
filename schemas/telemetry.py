"""Telemetry events published by node agents (and by the fleet simulator)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from schemas.column_types import Bool, Float64, Name, TimestampNs, UInt8, UInt16, UInt32, UInt64
from schemas.event import Event

Protocol = Literal["tcp", "udp", "roce"]


class FlowSample(Event):
    """Bytes of one flow segment as seen by the sender (tx) or receiver (rx).

    The sender's and receiver's samples share the 5-tuple and `seq`, which is
    what the flow-latency join keys on. `ts_ns` is the local clock at tx/rx.
    """

    SCHEMA = "flow_sample"
    ORDER_BY = ("node", "src_ip", "dst_ip", "ts_ns")

    interface: Name
    direction: Literal["tx", "rx"]
    src_ip: Name
    dst_ip: Name
    src_port: UInt16
    dst_port: UInt16
    proto: Protocol
    seq: UInt64
    bytes: UInt64
    packets: UInt64
    retransmits: UInt32 = 0
    priority: UInt8 = 0


class ClockProbe(Event):
    """One probe of a coded pair, reported by its receiver (`node`)."""

    SCHEMA = "clock_probe"

    pair_id: UInt64
    idx: Literal[0, 1]
    sender: Name
    receiver: Name
    tx_ns: TimestampNs
    rx_ns: TimestampNs


class CollectiveEvent(Event):
    """One collective operation (e.g. an all-reduce bucket) on one rank."""

    SCHEMA = "collective"
    ORDER_BY = ("job", "rank", "seq")

    job: Name
    rank: UInt32
    communicator: Name
    op: Literal["allreduce", "allgather", "reducescatter", "broadcast", "alltoall", "send", "recv", "barrier"]
    seq: UInt64
    bytes: UInt64
    start_ns: TimestampNs
    end_ns: TimestampNs

    @model_validator(mode="after")
    def _ends_after_start(self) -> CollectiveEvent:
        if self.end_ns < self.start_ns:
            raise ValueError("end_ns is before start_ns")
        return self


class IterationEvent(Event):
    """One training iteration on one rank."""

    SCHEMA = "iteration"
    ORDER_BY = ("job", "rank", "iteration")

    job: Name
    rank: UInt32
    iteration: UInt64
    start_ns: TimestampNs
    end_ns: TimestampNs

    @model_validator(mode="after")
    def _ends_after_start(self) -> IterationEvent:
        if self.end_ns < self.start_ns:
            raise ValueError("end_ns is before start_ns")
        return self


class GpuHealth(Event):
    """One NVML reading of one GPU. `lost` means the GPU fell off the bus."""

    SCHEMA = "gpu_health"
    ORDER_BY = ("node", "gpu", "ts_ns")

    gpu: UInt8
    uuid: Name
    lost: Bool = False
    temperature_c: Float64 = 0.0
    power_w: Float64 = 0.0
    sm_clock_mhz: UInt32 = 0
    mem_clock_mhz: UInt32 = 0
    gpu_util_pct: UInt8 = Field(default=0, le=100)
    mem_util_pct: UInt8 = Field(default=0, le=100)
    mem_used_bytes: UInt64 = 0
    throttle_reasons: UInt64 = 0
    ecc_corrected: UInt64 = 0
    ecc_uncorrected: UInt64 = 0
    xid: UInt32 = 0
    pcie_replay: UInt64 = 0
    nvlink_errors: list[UInt64] = Field(default_factory=list, max_length=64)


class LinkState(Event):
    """State of one network port, sent on every change and periodically."""

    SCHEMA = "link_state"
    ORDER_BY = ("node", "interface", "ts_ns")

    interface: Name
    kind: Literal["ethernet", "infiniband"]
    up: Bool
    carrier_changes: UInt64
    speed_mbps: UInt32 = 0
