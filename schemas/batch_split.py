"""Cut a batch into records that fit MAX_RECORD_BYTES, each a complete envelope of its own.

A batch whose encoded value is too big is cut into about as many parts by event count as its size
needs, and any part still too big is cut again, so events of very different sizes still fit. The
events keep their order across the records. An event too big for a record on its own is returned
apart, for the caller to refuse and count: it is never dropped silently.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from clocktower.schemas.codec import Headers, encode_batch
from clocktower.schemas.event import Event
from clocktower.schemas.topics import MAX_RECORD_BYTES


@dataclass(frozen=True)
class EncodedRecord:
    events: int
    key: bytes
    value: bytes
    headers: Headers


@dataclass
class SplitBatch:
    records: list[EncodedRecord] = field(default_factory=list)
    oversized: list[tuple[Event, int]] = field(default_factory=list)   # (event, its encoded size): refused


def encode_records(events: Sequence[Event], max_bytes: int = MAX_RECORD_BYTES, mixed_nodes: bool = False) -> SplitBatch:
    """The records (in order) for a non-empty batch of one schema from one node (`mixed_nodes`: from any nodes,
    for the streams' repartition topics), none over `max_bytes`."""
    out = SplitBatch()
    todo: list[Sequence[Event]] = [events]
    while todo:
        chunk = todo.pop()
        key, value, headers = encode_batch(chunk, mixed_nodes)
        if len(value) <= max_bytes:
            out.records.append(EncodedRecord(len(chunk), key, value, headers))
        elif len(chunk) == 1:
            out.oversized.append((chunk[0], len(value)))
        else:
            parts = min(len(chunk), max(2, math.ceil(len(value) / max_bytes)))
            step = math.ceil(len(chunk) / parts)
            todo.extend(chunk[i:i + step] for i in reversed(range(0, len(chunk), step)))
    return out
