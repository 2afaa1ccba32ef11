"""Group derived events into envelope records (one schema, one node per record), none over MAX_RECORD_BYTES."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from itertools import groupby
from typing import NamedTuple

from clocktower.schemas.batch_split import encode_records
from clocktower.schemas.codec import Headers
from clocktower.schemas.control import ControlCommand
from clocktower.schemas.event import Event
from clocktower.schemas.partitioning import partition_of
from clocktower.schemas.topics import topic_for

log = logging.getLogger(__name__)


_command_partitions: int | None = None   # control.commands' real partition count, once the worker has read it


def use_command_partitions(partitions: int) -> None:
    """Route commands by the topic's real partition count (read from the broker at start), which is what the
    actuators assign themselves by: an operator-made topic, or one the cluster refused to grow, may differ from the
    registry's count."""
    global _command_partitions
    _command_partitions = partitions


class Out(NamedTuple):
    """A record to publish. `partition` None: the producer's partitioner places it by key; a repartitioned
    record names its partition (the processor's key decides it, while the key stays the producing node)."""

    topic: str
    key: bytes
    value: bytes
    headers: Headers
    partition: int | None = None


def records(events: Iterable[Event], max_events: int = 1000, topic: str | None = None,
            partition: int | None = None, regrouped: bool = False) -> Iterator[Out]:
    """A record per node and schema (at most `max_events` events, none over the record limit), to the
    events' own topic or to `topic`/`partition`; `regrouped` (a repartition topic, which only the streams' own
    handler reads: schemas/codec.py `mixed_nodes`), a record per schema, many nodes' events in their order (a
    record per node made 15 small records of a 15-node fleet's 50 ms part). A control command goes to its node's
    partition of control.commands (schemas/partitioning.py), the one its node's actuator reads."""
    if regrouped and topic is None:
        raise ValueError("regrouped records go to a named repartition topic")
    keyf = (lambda e: type(e).SCHEMA) if regrouped else (lambda e: (type(e).SCHEMA, e.node))  # noqa: E731
    for _, grp in groupby(sorted(events, key=keyf), key=keyf):
        chunk = list(grp)
        for i in range(0, len(chunk), max_events):
            part = chunk[i:i + max_events]
            split = encode_records(part, mixed_nodes=regrouped)
            for event, size in split.oversized:   # derived events have bounded texts: not expected; never silent
                log.error("not published: a derived %s event of %s is %d bytes, over the record limit",
                          event.SCHEMA, event.node, size)
            spec = topic_for(type(part[0]))
            to = partition
            if topic is None and spec.model is ControlCommand:
                to = partition_of(part[0].node, _command_partitions or spec.partitions)
            for r in split.records:
                yield Out(topic or spec.name, r.key, r.value, r.headers, to)
