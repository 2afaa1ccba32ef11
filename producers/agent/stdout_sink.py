"""`clocktower agent --stdout`: event batches as JSON lines instead of Kafka, for debugging a node."""

from __future__ import annotations

import sys
from itertools import groupby
from typing import TextIO

import orjson

from clocktower.schemas.event import Event
from clocktower.schemas.topics import topic_for


class JsonLinesSink:
    """One line per (schema, node) batch: {"topic", "schema", "node", "count", "events": [...]}."""

    def __init__(self, out: TextIO | None = None) -> None:
        self.out = out or sys.stdout

    def __call__(self, events: list[Event]) -> None:
        key = lambda e: (type(e).SCHEMA, e.node)  # noqa: E731
        lines = []
        for (schema, node), group in groupby(sorted(events, key=key), key=key):
            batch = list(group)
            lines.append(orjson.dumps({"topic": topic_for(type(batch[0])).name, "schema": schema, "node": node,
                                       "count": len(batch), "events": [e.model_dump() for e in batch]}))
        self.out.write(b"\n".join(lines).decode() + "\n")
        self.out.flush()
