"""The topic registry: every Kafka topic, its event model, and its table.

One topic carries one schema. The sink stores each topic in the table named
here, and `clocktower` creates the topics with these settings at start.

The record size limit lives here, once: the publisher splits batches to fit it, the decoder refuses
records above it, the topics are created to accept it and the schema reference states it.
"""

from __future__ import annotations

from dataclasses import dataclass

from clocktower.schemas.analytics import (
    ClockEdgeFit,
    ClockEstimate,
    FlowLatency,
    Incident,
    IterationBlame,
    IterationBreakdown,
)
from clocktower.schemas.control import ControlAck, ControlCommand, ReplacementRequest
from clocktower.schemas.event import Event
from clocktower.schemas.operations import DeadLetter, InjectedFault, StreamsTick
from clocktower.schemas.telemetry import (
    ClockProbe,
    CollectiveEvent,
    ConnectionState,
    FlowCounters,
    FlowSample,
    GpuHealth,
    IterationEvent,
    LinkState,
    NodeHeartbeat,
)

DAY_MS = 24 * 3600 * 1000
# A record's value (the JSON array of events, uncompressed) is at most this many bytes. 1 MiB: what a
# Kafka broker accepts by default (1048588 bytes per record batch, compressed), so records fit an external
# cluster's topics even where their settings cannot be raised.
MAX_RECORD_BYTES = 1024 * 1024
# What a record adds beyond its value: key (a node name, at most 1 KiB of UTF-8), headers (schema,
# version, count, MAC, record id), record batch framing, and lz4/zstd's expansion of incompressible data.
RECORD_OVERHEAD_BYTES = 64 * 1024
# The topics' `max.message.bytes` and the producers' `message.max.bytes`: every record within
# MAX_RECORD_BYTES fits, compressed or not.
MAX_MESSAGE_BYTES = MAX_RECORD_BYTES + RECORD_OVERHEAD_BYTES
# `retention.bytes` of each partition of the topics that the actuators and the allocator read (issue 18, finding
# 1): anyone who reaches the broker can write, and the embedded broker has no quotas, so a flood of records there
# (130 forged 1 MiB commands made fetches of 130-204 MB, and the broker's RSS reached 2 GB) is bounded by what
# the broker keeps, oldest deleted first. A real fleet's commands, acks and requests are about 1 KB each: 64 MiB
# holds tens of thousands of them. The telemetry topics carry the fleet's volume and have no byte cap.
CONTROL_RETENTION_BYTES = 64 * 1024 * 1024
# Kafka deletes whole segments only, and its default segment is 1 GiB: without a smaller one a partition would grow
# to about that before `retention.bytes` took anything (the embedded broker cuts finer; found in review).
CONTROL_SEGMENT_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class TopicSpec:
    """A topic, the model of its events, and the ClickHouse table it lands in."""

    name: str
    model: type[Event]
    table: str
    partitions: int
    retention_ms: int
    description: str
    retention_bytes: int | None = None   # per partition; None: no byte cap

    @property
    def retention_days(self) -> int:
        return max(1, self.retention_ms // DAY_MS)

    @property
    def config(self) -> dict[str, str]:
        """The topic's Kafka settings, as created (and raised to on an existing topic)."""
        cap = {} if self.retention_bytes is None else {"retention.bytes": str(self.retention_bytes),
                                                       "segment.bytes": str(CONTROL_SEGMENT_BYTES)}
        return {"retention.ms": str(self.retention_ms), "max.message.bytes": str(MAX_MESSAGE_BYTES), **cap}


TOPICS: tuple[TopicSpec, ...] = (
    TopicSpec("telemetry.flows", FlowSample, "flow_samples", 6, 3 * DAY_MS, "per-segment flow bytes, tx and rx"),
    TopicSpec("telemetry.clock", ClockProbe, "clock_probes", 2, 1 * DAY_MS, "coded clock-probe pairs"),
    TopicSpec("telemetry.collectives", CollectiveEvent, "collectives", 2, 7 * DAY_MS, "NCCL/PyTorch collectives"),
    TopicSpec("telemetry.iterations", IterationEvent, "iterations", 2, 7 * DAY_MS, "training iterations per rank"),
    TopicSpec("telemetry.gpu", GpuHealth, "gpu_health", 2, 7 * DAY_MS, "NVML GPU health readings"),
    TopicSpec("telemetry.links", LinkState, "link_states", 1, 7 * DAY_MS, "network port state and flaps"),
    TopicSpec("telemetry.flowcounters", FlowCounters, "flow_counters", 2, 3 * DAY_MS,
              "per-flow bytes, packets and retransmits per drain interval (eBPF)"),
    TopicSpec("telemetry.connections", ConnectionState, "connection_states", 1, 7 * DAY_MS,
              "TCP connection lifecycle (eBPF)"),
    TopicSpec("telemetry.heartbeats", NodeHeartbeat, "heartbeats", 1, 7 * DAY_MS,
              "node agents' heartbeats: which nodes are alive"),
    TopicSpec("analytics.flow_latency", FlowLatency, "flow_latency", 2, 7 * DAY_MS, "one-way latency per segment"),
    TopicSpec("analytics.clock", ClockEstimate, "clock_estimates", 1, 7 * DAY_MS, "clock offset/drift per node"),
    TopicSpec("analytics.clock_edges", ClockEdgeFit, "clock_edges", 1, 1 * DAY_MS,
              "per-edge clock fits, input of the network solve (one partition: it must see every edge)"),
    TopicSpec("analytics.iterations", IterationBreakdown, "iteration_breakdown", 1, 30 * DAY_MS,
              "compute vs communication per rank and iteration"),
    TopicSpec("analytics.blame", IterationBlame, "iteration_blame", 1, 30 * DAY_MS,
              "per job and iteration: the slowest rank and why the iteration was slow"),
    TopicSpec("analytics.incidents", Incident, "incidents", 1, 90 * DAY_MS, "detected incidents"),
    TopicSpec("control.commands", ControlCommand, "control_commands", 4, 90 * DAY_MS,
              "signed commands, partitioned by node (schemas/partitioning.py): each actuator reads only its own",
              CONTROL_RETENTION_BYTES),
    TopicSpec("control.acks", ControlAck, "control_acks", 1, 90 * DAY_MS, "actuator acknowledgements",
              CONTROL_RETENTION_BYTES),
    TopicSpec("control.replacements", ReplacementRequest, "replacement_requests", 1, 90 * DAY_MS,
              "nodes to drain and replace, for the fleet's allocator", CONTROL_RETENTION_BYTES),
    TopicSpec("control.ticks", StreamsTick, "streams_ticks", 1, 1 * DAY_MS,
              "the stream workers' clock ticks: the allocator re-checks withheld requests on each",
              CONTROL_RETENTION_BYTES),
    TopicSpec("groundtruth.faults", InjectedFault, "faults_injected", 1, 90 * DAY_MS,
              "faults injected by the simulator"),
    TopicSpec("deadletter", DeadLetter, "deadletter", 1, 30 * DAY_MS, "records that failed decoding"),
)

BY_NAME: dict[str, TopicSpec] = {t.name: t for t in TOPICS}
BY_SCHEMA: dict[str, TopicSpec] = {t.model.SCHEMA: t for t in TOPICS}
BY_MODEL: dict[type[Event], TopicSpec] = {t.model: t for t in TOPICS}
TELEMETRY: tuple[TopicSpec, ...] = tuple(t for t in TOPICS if t.name.startswith("telemetry."))
# What is signed in a node's name (ct-node-mac, schemas/record_mac.py): the nodes' telemetry and acks, the
# replacement requests the streams publish for a node, the one-way latencies they publish for the receiving node
# (the congestion detector reads them back and orders QoS), and each stream worker's ticks (in the name of its
# instance id). With a producer key, the streams act on these only when
# signed, and the sink flags each of their rows (`_node_mac`); nodes sign nothing else.
NODE_SIGNED_TOPICS: frozenset[str] = frozenset({*(t.name for t in TELEMETRY), BY_MODEL[ControlAck].name,
                                               BY_MODEL[ReplacementRequest].name, BY_MODEL[StreamsTick].name,
                                               BY_MODEL[FlowLatency].name})


def topic_for(model: type[Event]) -> TopicSpec:
    """The topic that carries `model` events."""
    return BY_MODEL[model]
