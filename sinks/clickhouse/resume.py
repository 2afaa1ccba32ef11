"""Where a partition resumes: after what is stored or committed, unless the broker lost records.

The embedded noida-db can lose acknowledged records on a kill -9 and give their offsets to new
records; producers may refill the log past the old resume point before the sink notices. So on
every assignment (and after an out-of-range fetch) the record just below the resume point is
compared with the rows stored from it. Only a shown difference (or a log that now ends below the
resume point) is a loss: then a binary search finds the first offset whose record differs; the
sink deletes the rows stored from that offset on and reads the log again from there, so ClickHouse
mirrors the log exactly once. An unanswered check is no loss: the partition resumes where it was
and the check runs again at the next assignment. Pure logic: no Kafka here.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

OFFSET_BEGINNING = -2   # equal to confluent_kafka.OFFSET_BEGINNING: read from the first record kept

# same(offset): True when the record there is the one stored from that offset, False when it is
# not, None when the broker did not hand it over (unknown).
Same = Callable[[int], bool | None]


@dataclass(frozen=True)
class ResumePoint:
    offset: int                   # where to start reading (OFFSET_BEGINNING when nothing was read yet)
    lost: bool = False            # a loss was shown: rows stored from `offset` on are deleted and read again
    resume_was: int = -1          # the stored/committed resume point before the loss was found
    first_different: int = -1     # the lowest offset shown to hold another record (or past the log end): lost
    #                               are resume_was - first_different; offset < first_different when probes went
    #                               unanswered or the budget ran out (those records are read again, not counted)
    unchecked: bool = False       # the record below the resume point could not be fetched: no loss is assumed

    @property
    def certain(self) -> bool:
        """Whether `offset` is the first reused offset itself (not a lower bound of it)."""
        return self.offset == self.first_different


def known_resume(committed: int, stored: int) -> int:
    """The later of the group's committed offset and the offset after the last stored row; -1 if neither."""
    return max(committed, stored, -1)


def find_resume(committed: int, stored: int, low: int, high: int, same: Same,
                budget_s: float = 5.0, clock: Callable[[], float] = time.monotonic) -> ResumePoint:
    """The resume point of one partition with log [low, high), checked against what is stored.

    "Unknown" (a probe without answer) never deletes or counts anything by itself: an unanswered
    first check resumes at the old point (unchecked). Inside a search for a shown loss, unknown
    probes and a spent `budget_s` only move the start of the re-read down (to the end of the prefix
    proven the same), which costs a re-read, never a skip; only offsets from the lowest one shown
    to differ count as lost.
    """
    resume = known_resume(committed, stored)
    if resume < 0:
        return ResumePoint(OFFSET_BEGINNING)
    low = max(low, 0)
    if resume <= low:
        return ResumePoint(max(resume, low))   # nothing kept below the resume point to compare
    if resume <= high:
        check = same(resume - 1)
        if check is None:
            return ResumePoint(resume, unchecked=True)
        if check:
            return ResumePoint(resume)
        top = resume - 1                # shown to differ
    else:
        top = high                      # the log ends below the resume point: a loss for sure
    start, different = first_reused_offset(low, top, same, clock() + budget_s, clock)
    return ResumePoint(start, lost=True, resume_was=resume, first_different=different)


def first_reused_offset(lo: int, hi: int, same: Same, deadline: float = math.inf,
                        clock: Callable[[], float] = time.monotonic) -> tuple[int, int]:
    """(end of the prefix of [lo, hi) proven the same, lowest offset shown to differ, or `hi`).

    The broker keeps a prefix of what it acknowledged and gives the following offsets to new
    records, so `same` holds below the first reused offset and fails from it on: a binary search
    finds it in about log2(hi - lo) probes, and both answers are equal. An unknown probe, or the
    `deadline`, leaves a gap between them: the records there may be kept or new.
    """
    different = hi
    while lo < hi:
        if clock() > deadline:
            break
        mid = (lo + hi) // 2
        answer = same(mid)
        if answer:
            lo = mid + 1
        else:
            if answer is False:
                different = mid
            hi = mid
    return lo, different
