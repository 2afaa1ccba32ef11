"""Wait until every consumer has caught up with every topic (the end of a bounded run)."""

from __future__ import annotations

import time
from collections.abc import Callable

from clocktower.topic_admin import READERS, consumer_lag

SINK, STREAMS = "clocktower-sink", "clocktower-streams"


def lag(bootstrap: str, with_streams: bool = True) -> int:
    """Records not yet committed by the sink (all topics) and, if running, the streams (their inputs)."""
    readers = {g: READERS[g] for g in ((SINK, STREAMS) if with_streams else (SINK,))}
    return sum(row["lag"] for row in consumer_lag(bootstrap, readers))


def wait_drained(bootstrap: str, timeout: float, on_poll: Callable[[int], None] = lambda n: None,
                 check: Callable[[], object] = lambda: None, with_streams: bool = True) -> bool:
    """True once the lag is 0 on two polls in a row (streams may still emit after the first)."""
    deadline = time.monotonic() + timeout
    zero_polls = 0
    while time.monotonic() < deadline:
        check()
        n = lag(bootstrap, with_streams)
        on_poll(n)
        zero_polls = zero_polls + 1 if n == 0 else 0
        if zero_polls >= 2:
            return True
        time.sleep(1.0 if n == 0 else 0.5)
    return False
