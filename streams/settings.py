"""The stream worker's settings (CLOCKTOWER_* variables); clocktower/config.py composes them with the others."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator
from pydantic_settings import NoDecode

from clocktower.runtime.setting_text import json_or_text
from clocktower.runtime.settings import RuntimeSettings
from clocktower.streams.joins.flow_latency import DEFAULT_CLOCK_WAIT_NS


class StreamsSettings(RuntimeSettings):
    streams_instance_id: str | None = Field(default=None, description="static member id; unique per worker")
    clock_pure_tolerance_ns: float = Field(
        default=2_000.0, gt=0, description="a probe pair is pure when its arrival spacing is within this of its send "
        "spacing: 2000 suits kernel software timestamps, ~100 hardware (NIC) timestamps")
    clock_update_ms: float = Field(default=250.0, gt=0, description="probe time between clock estimates")
    remediation_max_per_hour: int = Field(
        default=2, ge=0, description="node replacements (drain + spare) the streams may order per hour of the "
        "wall clock of the worker that runs the replacement allocator (never event time, which producers write) "
        "without a human; more are reported as incidents that need approval. For the whole fleet, kept in the "
        "allocator's table.")
    streams_metrics_port: int = Field(default=0, ge=0, le=65535, description="Prometheus endpoint of the stream "
                                      "worker (its own port: the sink's CLOCKTOWER_METRICS_PORT may be on the same "
                                      "host); 0 disables it. Binds CLOCKTOWER_METRICS_HOST.")
    streams_idle_fetch_backoff_ms: int | None = Field(
        default=None, ge=0, le=5000, description="after a fetch that brought no records, wait this long before the "
        "next fetch to that broker: the most an idle worker adds to a record's latency. Unset: the broker profile's "
        "(0 with `kafka`, whose broker holds an empty fetch until a record comes; 250 with `embedded`, which answers "
        "empty fetches at once)")

    @property
    def idle_fetch_backoff_s(self) -> float:
        ms = self.streams_idle_fetch_backoff_ms
        return self.workarounds.idle_fetch_backoff_s if ms is None else ms / 1000
    streams_segment_ttl_s: float = Field(
        default=10.0, gt=0, description="event time a half-joined flow segment waits for its other half before it "
        "expires (counted in clocktower_streams_state_expired_total)")
    streams_link_watchdog_ms: float = Field(
        default=50.0, ge=0, le=3_600_000, description="a link (carrier lost or not up) down this long, by the "
        "node's own report times, gets a failover to its backup from the streams, whether or not it flapped (the "
        "agent's local watchdog is the fast path; this one catches a node without it); 0 = on the down report")
    streams_link_stable_s: float = Field(
        default=10.0, gt=0, le=86_400, description="a failed-over link whose carrier has been up, with no change, "
        "this long gets a restore and its incident resolves")
    streams_link_quarantine_flaps: int = Field(
        default=8, ge=1, le=10_000, description="a link that goes down more than this many times in a sliding hour "
        "is quarantined: traffic stays on the backup, no restore, until an operator runs `clocktower control "
        "release NODE IFACE`")
    streams_spare_nodes: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="spare nodes (comma-separated or a JSON list) that replace a node whose GPU "
        "is lost: the `spare` command goes to one of them, picked by the failed node's name; empty = no spare "
        "command, the incident says so")
    streams_fleet_nodes: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="the fleet's nodes (comma-separated or a JSON list): when set, a "
        "replacement is ordered only for a listed node (an invented name spends no budget; `clocktower control "
        "approve` still can); empty = any node")
    streams_known_after_s: float = Field(
        default=300.0, ge=0, le=86_400, description="a node not listed in CLOCKTOWER_STREAMS_FLEET_NODES spends the "
        "fleet's replacement budget only once its failing GPU has reported for this long (event time, from a start "
        "that cannot be dated before the partition's time): a name invented for a forged fault is held back for "
        "`clocktower control approve`. 0 = any node")
    streams_max_entries: int = Field(
        default=100_000, ge=100, le=100_000_000, description="state entries each processor keeps per partition (a "
        "GPU's or a link's is a few hundred bytes): a new key past that is not kept, and counted in "
        "clocktower_streams_state_refused_total, so invented names cannot grow a worker's state without bound")
    streams_max_fault_age_s: float = Field(
        default=900.0, gt=0, le=3000, description="a lost GPU's drain and spare are ordered only if its report is at "
        "most this old on the worker's wall clock (the streams lagged, or the report came late); an older one opens "
        "the incident saying it needs a human. Commands are valid for 60 s from when they are issued, whatever the "
        "fault's age; actuators accept none more than an hour past its event time")
    streams_clock_wait_s: float = Field(
        default=DEFAULT_CLOCK_WAIT_NS / 1e9, ge=0, le=60, description="a joined flow segment waits up to this long "
        "(event time, or the "
        "worker's clock) for the clock estimates that follow its timestamps before its one-way latency is published, "
        "so it is corrected by interpolation rather than extrapolation, or at all (streams/joins/flow_latency.py). "
        "Without clock probes every row comes this late: 0 = publish at once")
    streams_tick_s: float = Field(
        default=30.0, ge=1, le=3600, description="every this many seconds each worker publishes a tick to "
        "control.ticks: the replacement allocator then asks again for the drains its budget withheld, or gives them "
        "up as too old, even when no other request or ack comes (schemas/operations.py StreamsTick)")
    streams_regroup_linger_ms: float = Field(
        default=50.0, ge=0, le=5000, description="events regrouped by a processor's key (flows, jobs, probe edges) "
        "wait up to this long per repartition partition, so that one record carries many input records' events "
        "(streams/regroup_buffer.py): fewer records to send and read again. 0 = a record per input record")
    streams_producer_linger_ms: float = Field(
        default=5.0, ge=0, le=1000, description="how long the worker's producer gathers records into one produce "
        "request (aiokafka's linger_ms): a live stream of small records otherwise sends a request per record")
    streams_audit_dir: Path | None = Field(
        default=None, description="append `topic partition offset` of every record the worker hands to its "
        "processors to DIR/<instance id>.log, one unbuffered write each (a SIGKILL loses no line): an audit of lost "
        "input (streams/handled_audit.py). Off by default: it costs a write per record")
    streams_log_level: Literal["debug", "info", "warn", "error"] = Field(
        default="warn", description="the stream worker's log level (info shows rebalances and table recovery)")


    @field_validator("streams_spare_nodes", "streams_fleet_nodes", mode="before")
    @classmethod
    def _spare_nodes(cls, value: Any) -> list[str]:
        return parse_node_list(value)


def parse_node_list(value: Any) -> list[str]:
    """`node-a,node-b` or `["node-a", "node-b"]` (or a list) -> unique node names in order; ValueError says why."""
    value = json_or_text(value, "[", "spare nodes", lambda text: [p.strip() for p in text.split(",") if p.strip()])
    if not isinstance(value, list | tuple) or not all(isinstance(n, str) and 0 < len(n.strip()) <= 256 for n in value):
        raise ValueError("spare nodes must be node names (1-256 characters), comma-separated or a JSON list")
    return list(dict.fromkeys(n.strip() for n in value))
