"""Spot a partition whose fetched records stay uncommitted, so the worker ends and is restarted instead.

The inputs are the consumer's own truth, not Faust's bookkeeping: aiokafka's position (the next offset it will hand
to Faust) and the offset the broker holds as committed, the log start where none is (streams/engine/offset_watchdog.py).
Faust's read and committed offsets hid the fault of issue 17: records fetched and discarded in a rebalance, never
read again, left Faust's read offset at None, so its bookkeeping saw nothing to commit while the position stood at
the high watermark. Whatever the cause, a position ahead of the commit with neither moving means records the worker
holds no more and will never commit. A restarted worker resumes from the committed offsets and handles them again
(the processors drop or re-emit what they have seen), so the stream worker checks every `CHECK_S` and, if a
partition stays so for `STALL_CHECKS` checks in a row, ends itself with EXIT_COORDINATION_FAILED for its supervisor
to restart (streams/engine/group_join.py).

Checks are counted, not seconds, so a worker whose event loop was blocked for a while is not ended by the first
check after it. Pure: the worker feeds it the offsets; Faust commits every few seconds what was handled, so a
healthy partition is never ahead for long.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field

CHECK_S = 10.0
# Fetched but not processed, nothing moving: 5 minutes. A minute was too short: on an overloaded machine (the demo
# beside the kill test and a CPU hog) an agent waited over a minute to send its outputs, and the check restarted
# healthy workers (issue 17).
STALL_CHECKS = 30
# Processed (outputs sent, so acked at once) but not committed, nothing moving: a minute. Faust's commits had stopped
# below such records in a loaded kill-test run (every record of the partition handled, its commit stuck for good).
PROCESSED_STALL_CHECKS = 6


@dataclass
class CommitStall:
    stall_checks: int = STALL_CHECKS
    processed_stall_checks: int = PROCESSED_STALL_CHECKS
    _seen: dict[Hashable, tuple[tuple[int, int, int | None], int]] = field(default_factory=dict)

    def check(self, partitions: Mapping[Hashable, tuple[int | None, int | None, int | None]]) -> list[Hashable]:
        """The partitions stalled now. `partitions`: per partition, the consumer's position (None: it has none
        now, an offset reset pending), the committed offset (or the log start where nothing was committed), and
        the last offset the worker processed (None: none)."""
        seen: dict[Hashable, tuple[tuple[int, int, int | None], int]] = {}
        stalled = []
        for tp, (pos, committed, processed) in partitions.items():
            if pos is None or committed is None or pos <= committed:
                continue
            prev = self._seen.get(tp)
            checks = prev[1] + 1 if prev is not None and prev[0] == (pos, committed, processed) else 1
            seen[tp] = ((pos, committed, processed), checks)
            uncommitted = processed is not None and processed >= committed
            if checks >= (self.processed_stall_checks if uncommitted else self.stall_checks):
                stalled.append(tp)
        self._seen = seen
        return stalled

    def counting(self) -> dict[Hashable, tuple[tuple[int, int, int | None], int]]:
        """Per partition now counted: its (position, committed, processed) and the checks it has not moved for."""
        return dict(self._seen)
