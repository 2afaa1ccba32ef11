"""Wait until every consumer has caught up with every topic (the end of a bounded run)."""

from __future__ import annotations

import time
from collections.abc import Callable

from clocktower.streams.settings import StreamsSettings
from clocktower.topic_admin import READERS, consumer_lag

SINK, STREAMS = "clocktower-sink", "clocktower-streams"


def streams_settle_s() -> float:
    """With the streams, what they hold on their own clock must have come out too: a flow segment waits up to
    CLOCKTOWER_STREAMS_CLOCK_WAIT_S (as configured; default 3 s) for its clock estimates after its input was read,
    and the worker publishes it on a 0.25 s timer. So drained means no lag for that long and a second more."""
    return StreamsSettings().streams_clock_wait_s + 1.0


def lag(bootstrap: str, with_streams: bool = True) -> int:
    """Records not yet committed by the sink (all topics) and, if running, the streams (their inputs)."""
    return _lag_and_commits(bootstrap, with_streams)[0]


def _lag_and_commits(bootstrap: str, with_streams: bool) -> tuple[int, int]:
    """The lag, and the sum of the committed offsets: it grows while the consumers get on."""
    readers = {g: READERS[g] for g in ((SINK, STREAMS) if with_streams else (SINK,))}
    rows = consumer_lag(bootstrap, readers)
    return sum(r["lag"] for r in rows), sum(r["committed"] or 0 for r in rows)


def wait_drained(bootstrap: str, timeout: float | None, on_poll: Callable[[int], None] = lambda n: None,
                 check: Callable[[], object] = lambda: None, with_streams: bool = True,
                 stall_s: float | None = None, settle_s: float | None = None) -> bool:
    """True once the lag is 0 on two polls in a row (streams may still emit after the first) and has stayed 0 for
    `settle_s` (default: streams_settle_s() with the streams, else 0). False after `timeout` seconds (None: no
    limit), or once no consumer has committed anything for `stall_s` seconds while records wait: a slow machine that
    still catches up is waited for, a pipeline that stopped is not."""
    start = time.monotonic()
    commits, moved_at = -1, start
    zero_polls = 0
    settle = (streams_settle_s() if with_streams else 0.0) if settle_s is None else settle_s
    zero_since = start
    while True:
        check()
        n, now_commits = _lag_and_commits(bootstrap, with_streams)
        on_poll(n)
        now = time.monotonic()
        if now_commits != commits or n == 0:
            commits, moved_at = now_commits, now
        zero_polls = zero_polls + 1 if n == 0 else 0
        if zero_polls == 1:
            zero_since = now   # the lag has been 0 since this poll
        if zero_polls >= 2 and now - zero_since >= settle:
            return True
        if (timeout is not None and now - start >= timeout) or (stall_s is not None and now - moved_at >= stall_s):
            return False
        time.sleep(1.0 if n == 0 else 0.5)
