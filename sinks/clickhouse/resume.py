"""Where a partition resumes: after what is stored or committed, unless the broker lost records.

A resume point past the log end means the broker dropped acknowledged records and gave
their offsets to new ones (the embedded noida-db does after a kill -9). Then the sink
resumes at the first offset whose record differs from the row stored there: nothing new
is skipped, nothing kept is doubled, and the lost records' rows are marked, not counted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import OFFSET_BEGINNING


@dataclass(frozen=True)
class ResumePoint:
    offset: int                   # where to start reading (OFFSET_BEGINNING when nothing was read yet)
    lost: bool = False            # the stored/committed point is past the log end: the broker lost records
    lost_count: int = 0           # at least this many acknowledged records are gone


def resume_point(committed: int, stored: int, log_end: int) -> ResumePoint:
    """From the group's committed offset, the offset after the last stored row (-1: none) and the high watermark."""
    known = [o for o in (committed, stored) if o >= 0]
    if not known:
        return ResumePoint(OFFSET_BEGINNING)
    resume = max(known)
    if log_end >= 0 and resume > log_end:
        return ResumePoint(log_end, lost=True, lost_count=resume - log_end)
    return ResumePoint(resume)


def first_reused_offset(lo: int, hi: int, same: Callable[[int], bool]) -> int:
    """The first offset in [lo, hi) whose record is not the one stored at that offset (hi if all are).

    The broker keeps a prefix of what it acknowledged and gives the following offsets to new
    records, so `same` holds below the answer and fails from it on: a binary search finds it.
    """
    while lo < hi:
        mid = (lo + hi) // 2
        if same(mid):
            lo = mid + 1
        else:
            hi = mid
    return lo
