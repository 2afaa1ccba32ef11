"""Group derived events into envelope records (one schema, one node per record)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import groupby

from clocktower.schemas.codec import Headers, encode_batch
from clocktower.schemas.event import Event
from clocktower.schemas.topics import topic_for


def records(events: Iterable[Event], max_events: int = 1000) -> Iterator[tuple[str, bytes, bytes, Headers]]:
    """(topic, key, value, headers) for each record the events make."""
    keyf = lambda e: (type(e).SCHEMA, e.node)  # noqa: E731
    for _, grp in groupby(sorted(events, key=keyf), key=keyf):
        chunk = list(grp)
        for i in range(0, len(chunk), max_events):
            part = chunk[i:i + max_events]
            key, value, headers = encode_batch(part)
            yield topic_for(type(part[0])).name, key, value, headers
