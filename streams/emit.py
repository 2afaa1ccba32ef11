"""Group derived events into envelope records (one schema, one node per record), none over MAX_RECORD_BYTES."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from itertools import groupby

from clocktower.schemas.batch_split import encode_records
from clocktower.schemas.codec import Headers
from clocktower.schemas.event import Event
from clocktower.schemas.topics import topic_for

log = logging.getLogger(__name__)


def records(events: Iterable[Event], max_events: int = 1000) -> Iterator[tuple[str, bytes, bytes, Headers]]:
    """(topic, key, value, headers) for each record the events make."""
    keyf = lambda e: (type(e).SCHEMA, e.node)  # noqa: E731
    for _, grp in groupby(sorted(events, key=keyf), key=keyf):
        chunk = list(grp)
        for i in range(0, len(chunk), max_events):
            part = chunk[i:i + max_events]
            split = encode_records(part)
            for event, size in split.oversized:   # derived events have bounded texts: not expected; never silent
                log.error("not published: a derived %s event of %s is %d bytes, over the record limit",
                          event.SCHEMA, event.node, size)
            for r in split.records:
                yield topic_for(type(part[0])).name, r.key, r.value, r.headers
