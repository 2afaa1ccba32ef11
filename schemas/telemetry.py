"""Telemetry events published by node agents (and by the fleet simulator)."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, model_validator

from clocktower.schemas.column_types import (
    CH,
    Bool,
    Float64,
    Name,
    Sequence,
    TimestampNs,
    UInt8,
    UInt16,
    UInt32,
    UInt64,
)
from clocktower.schemas.event import Event, column_rule, missing_when_required

Protocol = Literal["tcp", "udp", "roce"]
Percent = Annotated[int, Field(ge=0, le=100), CH("UInt8")]
CollectiveSource = Literal["hook", "flight_recorder"]


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
    seq: Sequence
    bytes: UInt64
    packets: UInt64
    retransmits: UInt32
    priority: UInt8 = Field(description="skb priority (traffic class)")


class ClockProbe(Event):
    """One probe of a coded pair, reported by its receiver (`node`)."""

    SCHEMA = "clock_probe"

    pair_id: Sequence
    idx: Literal[0, 1]
    sender: Name
    receiver: Name
    tx_ns: TimestampNs
    rx_ns: TimestampNs


class CollectiveEvent(Event):
    """One collective operation (e.g. an all-reduce bucket) on one rank.

    `source` says who reported it: "hook" (the DDP comm hook, one row per gradient bucket; the simulator's rows
    too) or "flight_recorder" (PyTorch's flight recorder, communicator "fr:..."; every collective of the
    process group, so the hook's all-reduces appear there again). Count traffic from one source only:
    `WHERE source = 'hook'`. Records from before the field existed default to "flight_recorder" when their
    communicator starts with "fr:", else "hook".
    """

    SCHEMA = "collective"
    ORDER_BY = ("job", "rank", "seq")
    # For tables made before `source` existed: what their rows read (sinks/clickhouse adds the column).
    COLUMN_DEFAULTS: ClassVar[dict[str, str]] = {
        "source": "if(startsWith(communicator, 'fr:'), 'flight_recorder', 'hook')"}

    job: Name
    rank: UInt32
    communicator: Name
    op: Literal["allreduce", "allgather", "reducescatter", "broadcast", "alltoall", "send", "recv", "barrier"]
    seq: Sequence
    bytes: UInt64
    start_ns: TimestampNs
    end_ns: TimestampNs
    source: CollectiveSource = "hook"

    @model_validator(mode="before")
    @classmethod
    @column_rule("all_fields_given")
    def _source_of_old_records(cls, data: Any) -> Any:
        if isinstance(data, dict) and "source" not in data and str(data.get("communicator", "")).startswith("fr:"):
            return {**data, "source": "flight_recorder"}
        return data

    @model_validator(mode="after")
    @column_rule("ordered", "start_ns", "end_ns")
    def _ends_after_start(self) -> CollectiveEvent:
        if self.end_ns < self.start_ns:
            raise ValueError("end_ns is before start_ns")
        return self


class IterationEvent(Event):
    """One training iteration on one rank.

    `collectives`: how many comm-hook collectives (source "hook") the rank launched during the iteration, so
    the breakdown can close as soon as it holds them all, the last iteration of a job included; null when the
    producer does not count them (older producers), and the breakdown then waits for later collectives.
    """

    SCHEMA = "iteration"
    ORDER_BY = ("job", "rank", "iteration")

    job: Name
    rank: UInt32
    iteration: Sequence
    start_ns: TimestampNs
    end_ns: TimestampNs
    collectives: UInt32 | None = None
    gpu: UInt8 | None = Field(default=None, description="the rank's GPU: its device index on its node (LOCAL_RANK), "
                                                        "so a slow rank is traced to one GPU; null = unknown")
    world_size: UInt32 | None = Field(default=None, description="how many ranks the job runs (WORLD_SIZE), so an "
                                                                "iteration is judged across ranks once all of them "
                                                                "reported it, whatever their order; null = unknown")

    @model_validator(mode="after")
    @column_rule("ordered", "start_ns", "end_ns")
    def _ends_after_start(self) -> IterationEvent:
        if self.end_ns < self.start_ns:
            raise ValueError("end_ns is before start_ns")
        return self


class GpuHealth(Event):
    """One NVML reading of one GPU. `lost` means the GPU fell off the bus.

    Every field is required. A reading is null (NULL in ClickHouse) where NVML did not give one: the GPU
    does not support it, or the GPU is lost (then every reading is null). A missing field is a dead
    letter, never a stored 0. `xid` 0 means no XID event came with this reading.
    """

    SCHEMA = "gpu_health"
    ORDER_BY = ("node", "gpu", "ts_ns")

    gpu: UInt8 = Field(description="NVML device index")
    uuid: Name
    lost: Bool
    temperature_c: Float64 | None = Field(description="GPU core temperature, °C")
    power_w: Float64 | None = Field(description="power draw, W")
    sm_clock_mhz: UInt32 | None = Field(description="SM clock, MHz")
    mem_clock_mhz: UInt32 | None = Field(description="memory clock, MHz")
    gpu_util_pct: Percent | None = Field(description="GPU utilisation, %")
    mem_util_pct: Percent | None = Field(description="memory bandwidth utilisation, %")
    mem_used_bytes: UInt64 | None = Field(description="device memory used, bytes")
    throttle_reasons: UInt64 | None = Field(description="NVML clocks-event reasons bit mask")
    ecc_corrected: UInt64 | None = Field(description="corrected ECC errors since driver load (volatile)")
    ecc_uncorrected: UInt64 | None = Field(description="uncorrected ECC errors since driver load (volatile)")
    xid: UInt32 = Field(description="XID error code that triggered this reading; 0 = none")
    pcie_replay: UInt64 | None = Field(description="PCIe replay counter")
    nvlink_errors: list[UInt64] = Field(max_length=64,
                                        description="per NVLink, its error counters summed; [] = none read")
    throttle: list[Name] = Field(max_length=32,
                                 description="throttle_reasons decoded: thermal, power, hw_slowdown, ...; "
                                             "[] when none or unknown")
    retired_pages: UInt64 | None = Field(description="retired memory pages (single- and double-bit ECC)")
    remapped_rows_correctable: UInt64 | None = Field(description="rows remapped for correctable errors")
    remapped_rows_uncorrectable: UInt64 | None = Field(description="rows remapped for uncorrectable errors")
    remap_pending: Bool | None = Field(description="a row remap waits for a GPU reset")
    remap_failed: Bool | None = Field(description="a row remap failed")


class LinkState(Event):
    """State of one network port, sent on every change and periodically.

    The InfiniBand/RoCE port state and counters (sysfs `ports/N/state`, `ports/N/counters/*`) are required
    for `kind` "infiniband" and default to "none"/0 for Ethernet ports, where they do not apply. An IB counter
    is null (NULL in ClickHouse) where it could not be read (file missing or unreadable), never a fake 0.
    port_*_data are bytes (sysfs counts 4-byte words). For IB ports `operstate` is the physical state
    (e.g. "LinkUp") and `carrier_changes` is the `link_downed` counter (one per flap, not two).

    `link` names the physical port this report is about, so one port is one link in every detector: an RDMA
    port with a netdev (RoCE `mlx5_0/1` over `eth0`, found in sysfs) has `link` "eth0"; "" means the interface
    itself. `backup` is the port that carries this one's traffic when it fails (per-node configuration, or
    discovered from the routes); "" means it has none, and no failover can be asked for.

    `on_backup` and `quarantined` are what the node's own actuator knows when the report is made: whether this
    port's traffic is on its backup now (moved by the agent's watchdog or by a command) and whether it is held
    there until an operator's release. Null where the agent runs no actuator. The pipeline reads them to restore
    a link the agent's watchdog moved by itself and to see a release.
    """

    SCHEMA = "link_state"
    ORDER_BY = ("node", "interface", "ts_ns")
    REQUIRED_WHEN = {("kind", "infiniband"): (
        "ib_state", "port_xmit_data", "port_rcv_data", "port_xmit_packets", "port_rcv_packets", "port_rcv_errors",
        "port_xmit_discards", "symbol_error", "link_downed", "link_error_recovery")}

    interface: Name
    kind: Literal["ethernet", "infiniband"]
    up: Bool
    carrier_changes: UInt64
    speed_mbps: UInt32 = Field(description="link speed, Mbit/s; 0 while down or where unknown")
    operstate: Name = Field(description="kernel operstate (Ethernet) or IB physical state")
    carrier: Bool
    ib_state: Name = "none"
    port_xmit_data: UInt64 | None = Field(default=0, description="bytes sent; null = not read")
    port_rcv_data: UInt64 | None = Field(default=0, description="bytes received; null = not read")
    port_xmit_packets: UInt64 | None = 0
    port_rcv_packets: UInt64 | None = 0
    port_rcv_errors: UInt64 | None = 0
    port_xmit_discards: UInt64 | None = 0
    symbol_error: UInt64 | None = 0
    link_downed: UInt64 | None = 0
    link_error_recovery: UInt64 | None = 0
    link: str = Field(default="", max_length=256, description="the physical port reported on (\"\" = interface)")
    backup: str = Field(default="", max_length=256, description="this port's backup port (\"\" = none)")
    on_backup: Bool | None = Field(default=None, description="traffic on the backup now, per the node's actuator; "
                                   "null = no actuator")
    quarantined: Bool | None = Field(default=None, description="held on the backup until released, per the node's "
                                     "actuator; null = no actuator")

    @model_validator(mode="after")
    @column_rule("all_fields_given")
    def _ib_counters_given(self) -> LinkState:
        missing_when_required(self)
        return self


class FlowCounters(Event):
    """Bytes (and packets, retransmits) of one flow in one direction over one drain interval, from eBPF.

    `source` "sock" counts socket payload bytes (sock_send_length / sock_recv_length tracepoints, plus
    tcp_retransmit_skb); "tc" counts packets and bytes on the wire per flow and skb priority at a tc
    clsact classifier on `interface`. The 5-tuple is as seen from this node (src = local for tx).
    `interface` is required for "tc" and "" for "sock" (a socket has no interface); `packets` is 0 for
    "sock" (socket payload has no packets) and `retransmits` 0 for "tc" (a classifier sees none): each is
    required where its source counts it and defaults to 0 where it does not.
    """

    SCHEMA = "flow_counters"
    ORDER_BY = ("node", "src_ip", "dst_ip", "src_port", "dst_port", "ts_ns")
    REQUIRED_WHEN = {("source", "sock"): ("retransmits",), ("source", "tc"): ("interface", "packets")}

    source: Literal["sock", "tc"]
    interface: str = Field(default="", max_length=256)
    direction: Literal["tx", "rx"]
    src_ip: Name
    dst_ip: Name
    src_port: UInt16
    dst_port: UInt16
    proto: Protocol
    priority: UInt32 = Field(description="skb priority; 0 for sock")
    bytes: UInt64
    packets: UInt64 = 0
    retransmits: UInt32 = 0
    interval_ns: UInt64 = Field(description="length of the drain interval, ns")

    @model_validator(mode="after")
    @column_rule("all_fields_given")
    def _counted_fields_given(self) -> FlowCounters:
        missing_when_required(self)
        return self


class ConnectionState(Event):
    """A TCP connection changed state (sock:inet_sock_set_state): its lifecycle, as seen on this node.

    `proto` defaults to "tcp": the agent attaches to that tracepoint for TCP sockets only.
    """

    SCHEMA = "connection_state"
    ORDER_BY = ("node", "src_ip", "dst_ip", "src_port", "dst_port", "ts_ns")

    src_ip: Name
    dst_ip: Name
    src_port: UInt16
    dst_port: UInt16
    proto: Protocol = "tcp"
    old_state: Name
    new_state: Name


class NodeHeartbeat(Event):
    """The node agent is alive: one every `interval_ms`, whatever its sources have to say.

    A node whose heartbeats stop while its peers' go on has gone silent (the agent died, the host hung, its
    management network is cut): the silent-node detector says so. `seq` counts from the agent's start, so a
    restarted agent is seen as one (seq back to 0). The table also says when each node last reported.
    """

    SCHEMA = "heartbeat"
    ORDER_BY = ("node", "ts_ns")

    seq: Sequence
    interval_ms: UInt32 = Field(ge=1, description="how often this agent sends one, ms")
