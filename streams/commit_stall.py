"""Spot a partition whose handled records stay uncommitted, so the worker ends and is restarted instead.

Seen under load with 3 workers against the embedded broker, after a worker was killed and the group
rebalanced (cause not found; see the issue notes): a live worker read some partitions to their end and
never committed them again, with no error logged, so their records were never counted as handled and the
pipeline never drained. A restarted worker resumes from the committed offsets and handles them again
(the processors drop or re-emit what they have seen), so the stream worker checks every `CHECK_S` and, if
a partition read ahead of its committed offset keeps both unchanged for `STALL_S`, ends itself with
EXIT_COORDINATION_FAILED for its supervisor to restart (streams/group_join.py).

Pure: the app feeds it (read offset, committed offset) per partition; Faust commits every few seconds,
so a healthy partition is never stalled for long.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field

CHECK_S = 10.0
STALL_S = 60.0


@dataclass
class CommitStall:
    stall_s: float = STALL_S
    _since: dict[Hashable, tuple[int, int | None, float]] = field(default_factory=dict)

    def check(self, offsets: Mapping[Hashable, tuple[int | None, int | None]], now: float) -> list[Hashable]:
        """The partitions stalled at `now`. `offsets`: per partition, the offset of the last record handed to the
        streams (None: none since it was assigned) and the committed offset (the next to read; None: never)."""
        seen: dict[Hashable, tuple[int, int | None, float]] = {}
        stalled = []
        for tp, (read, committed) in offsets.items():
            if read is None or (committed is not None and read < committed):
                continue                      # nothing read, or everything read is committed
            prev = self._since.get(tp)
            since = prev[2] if prev is not None and prev[:2] == (read, committed) else now
            seen[tp] = (read, committed, since)
            if now - since >= self.stall_s:
                stalled.append(tp)
        self._since = seen
        return stalled
