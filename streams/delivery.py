"""Where an event was read, so that a replay is told by position rather than by the event's own time.

A worker killed before its commit reads the same records again at the same offsets; a record dated ahead
by whoever wrote it cannot move those. The runner sets the position of each event on its StateStore before
`process` (streams/processor_runner.py); the in-memory pipeline has none, and sets None.
"""

from __future__ import annotations

from typing import NamedTuple


class Delivery(NamedTuple):
    """An event's record ("topic:partition" and offset) and its index in the record's batch."""

    source: str
    offset: int
    index: int


def delivery_of(topic: str, partition: int, offset: int, index: int) -> Delivery:
    return Delivery(f"{topic}:{partition}", offset, index)
