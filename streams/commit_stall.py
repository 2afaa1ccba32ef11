"""Spot a partition whose records stay unhandled or uncommitted, so the worker ends and is restarted instead.

Seen under load with 3 workers against the embedded broker, after a worker was killed and the group
rebalanced (cause not found; see the issue notes): a live worker read some partitions to their end and
never committed them again, with no error logged, so their records were never counted as handled and the
pipeline never drained. A restarted worker resumes from the committed offsets and handles them again
(the processors drop or re-emit what they have seen), so the stream worker checks every `CHECK_S` and, if a
partition was read ahead of its committed offset and neither offset moves for `STALL_CHECKS` checks in a row,
ends itself with EXIT_COORDINATION_FAILED for its supervisor to restart (streams/group_join.py).

Checks are counted, not seconds, so a worker whose event loop was blocked for a while is not ended by the
first check after it. Faust records a commit the broker refused (after a rebalance) as done: such a
partition is not seen as stalled here. Pure: the app feeds it the offsets; Faust commits every few seconds,
so a healthy partition is never read ahead for long.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field

CHECK_S = 10.0
STALL_CHECKS = 6        # about a minute


@dataclass
class CommitStall:
    stall_checks: int = STALL_CHECKS
    _seen: dict[Hashable, tuple[int | None, int | None, int]] = field(default_factory=dict)

    def check(self, partitions: Mapping[Hashable, tuple[int | None, int | None]]) -> list[Hashable]:
        """The partitions stalled now. `partitions`: per partition, the offset of the last record handed to the
        streams (None: none) and the committed offset, the next to read (None: never, or 0 as Faust keeps it)."""
        seen: dict[Hashable, tuple[int | None, int | None, int]] = {}
        stalled = []
        for tp, (read, committed) in partitions.items():
            if not _read_ahead(read, committed):
                continue
            prev = self._seen.get(tp)
            checks = prev[2] + 1 if prev is not None and prev[:2] == (read, committed) else 1
            seen[tp] = (read, committed, checks)
            if checks >= self.stall_checks:
                stalled.append(tp)
        self._seen = seen
        return stalled


def _read_ahead(read: int | None, committed: int | None) -> bool:
    """Whether records were handed over that are not committed. After a rebalance Faust sets the read offset to
    the committed one (read == committed), or to 0 with committed None when 0 was committed: neither counts, so
    a record stuck at exactly those offsets is only seen once the next one is read."""
    if read is None:
        return False
    if committed is None:
        return read > 0
    return read > committed
