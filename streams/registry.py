"""The list of stream processors, and everything derived from it.

Adding a processor is one file (a `Processor` subclass) plus one line in `PROCESSORS`. From that line the
Faust app gets its agents and tables, the topic setup its repartition and changelog topics, the drain
check and `clocktower topics` the streams' lag, and the in-memory pipeline its stages. No module keeps a
second list of the streams' topics.
"""

from __future__ import annotations

from dataclasses import dataclass

from clocktower.schemas.topics import BY_MODEL, MAX_MESSAGE_BYTES, TopicSpec
from clocktower.streams.detectors.congestion import CongestionDetector
from clocktower.streams.detectors.gpu_fault import GpuFaultDetector
from clocktower.streams.detectors.iteration_blame import IterationBlameProcessor
from clocktower.streams.detectors.link_flap import LinkFlapDetector
from clocktower.streams.detectors.replacement_allocator import ReplacementAllocator
from clocktower.streams.detectors.silent_node import SilentNodeDetector
from clocktower.streams.detectors.straggler import StragglerDetector
from clocktower.streams.joins.clock_edges import ClockEdgeFits
from clocktower.streams.joins.clock_solve import ClockSolve
from clocktower.streams.joins.flow_latency import FlowLatencyJoin
from clocktower.streams.joins.iteration_breakdown import IterationBreakdownJoin
from clocktower.streams.processor import Processor
from clocktower.streams.processor_context import ProcessorContext

APP_ID = "clocktower-streams"   # the Faust app id: its consumer group, and the prefix of its internal topics

PROCESSORS: tuple[type[Processor], ...] = (
    FlowLatencyJoin,
    IterationBreakdownJoin,
    LinkFlapDetector,
    GpuFaultDetector,
    CongestionDetector,
    StragglerDetector,
    IterationBlameProcessor,
    SilentNodeDetector,
    ReplacementAllocator,
    ClockEdgeFits,
    ClockSolve,
)

REPARTITION_RETENTION_MS = 24 * 3600 * 1000   # a regrouped record is read within seconds; a day covers an outage


@dataclass(frozen=True)
class InternalTopic:
    """A topic the streams make for themselves: a repartition topic or a table's changelog."""

    name: str
    partitions: int
    config: dict[str, str]


def inputs(cls: type[Processor]) -> list[TopicSpec]:
    """The topics a processor's events come from, in the order of its `consumes`."""
    return [BY_MODEL[m] for m in cls.consumes]


def partitions(cls: type[Processor]) -> int:
    """The partitions its state is spread over: its repartition topic's, or else its input's."""
    counts = {t.partitions for t in inputs(cls)}
    if repartitions(cls):
        return max(counts)
    if len(counts) != 1:
        raise ValueError(f"{cls.name}: node-keyed inputs with different partition counts {sorted(counts)} "
                         "cannot share one table; repartition them")
    return counts.pop()


def repartitions(cls: type[Processor]) -> bool:
    """Whether its input is regrouped by its own key: it is not keyed by node, and spans several partitions."""
    return cls.key_by != "node" and max(t.partitions for t in inputs(cls)) > 1


def repartition_topic(cls: type[Processor]) -> str:
    return f"{APP_ID}-{cls.name}-repartition"


def changelog_topic(cls: type[Processor]) -> str:
    """Faust's name for the changelog of the table named after the processor."""
    return f"{APP_ID}-{cls.name}-changelog"


def input_topics() -> tuple[str, ...]:
    """Every topic the streams read from producers or from each other (not their own internal topics)."""
    seen: dict[str, None] = {}
    for cls in PROCESSORS:
        for t in inputs(cls):
            seen.setdefault(t.name, None)
    return tuple(seen)


def internal_topics() -> list[InternalTopic]:
    """The repartition and changelog topics, as the topic setup creates them."""
    out = []
    size = {"max.message.bytes": str(MAX_MESSAGE_BYTES)}
    for cls in PROCESSORS:
        if repartitions(cls):
            out.append(InternalTopic(repartition_topic(cls), partitions(cls),
                                     {"retention.ms": str(REPARTITION_RETENTION_MS), **size}))
        if cls.durable:
            out.append(InternalTopic(changelog_topic(cls), partitions(cls), {"cleanup.policy": "compact", **size}))
    return out


def stateful_topics() -> set[str]:
    """Topics whose partition count fixes where table state lives: the changelogs, the repartition topics and
    the inputs of node-keyed durable processors. Growing one moves keys to partitions whose state is empty."""
    out = {t.name for t in internal_topics()}
    for cls in PROCESSORS:
        if cls.durable and not repartitions(cls):
            out.update(t.name for t in inputs(cls))
    return out


def streams_reads() -> tuple[str, ...]:
    """What the streams' consumer group reads: inputs and repartition topics (their lag is the streams')."""
    return input_topics() + tuple(repartition_topic(c) for c in PROCESSORS if repartitions(c))


def build(ctx: ProcessorContext) -> list[Processor]:
    """One instance of every processor, for one worker."""
    return [cls.from_context(ctx) for cls in PROCESSORS]
