"""Where a partition resumes: after what is stored or committed, unless the broker lost records.

The embedded noida-db can lose acknowledged records on a kill -9 and give their offsets to new
records; producers may refill the log past the old resume point before the sink notices. So on
every assignment (and after an out-of-range fetch) the record just below the resume point is
compared with the rows stored from it. If it differs (or the log now ends below the resume
point), a binary search finds the first offset whose record differs; the sink deletes the rows
stored from that offset on and reads the log again from there, so ClickHouse mirrors the log
exactly once. Pure logic: no Kafka here.
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
    lost: bool = False            # records stored or committed at offsets >= `offset` are no longer in the log
    resume_was: int = -1          # the stored/committed resume point before the loss was found
    certain: bool = True          # False: a probe was unknown or the budget ran out, so `offset` may be lower
    #                               than the first reused offset (safe: more is deleted and read again)


def known_resume(committed: int, stored: int) -> int:
    """The later of the group's committed offset and the offset after the last stored row; -1 if neither."""
    return max(committed, stored, -1)


def find_resume(committed: int, stored: int, low: int, high: int, same: Same,
                budget_s: float = 5.0, clock: Callable[[], float] = time.monotonic) -> ResumePoint:
    """The resume point of one partition with log [low, high), checked against what is stored.

    Unknown probes count as "differs" and a search that runs out of `budget_s` stops at the last
    offset proven the same: both only move the answer down, which costs a re-read, never a skip.
    """
    resume = known_resume(committed, stored)
    if resume < 0:
        return ResumePoint(OFFSET_BEGINNING)
    low = max(low, 0)
    if resume <= low:
        return ResumePoint(max(resume, low))   # nothing kept below the resume point to compare
    if resume <= high:
        check = same(resume - 1)
        if check:
            return ResumePoint(resume)
        top = resume - 1
    else:
        top = high                      # the log ends below the resume point: a loss for sure
        check = False
    first, certain = first_reused_offset(low, top, same, clock() + budget_s, clock)
    return ResumePoint(first, lost=True, resume_was=resume, certain=certain and check is not None)


def first_reused_offset(lo: int, hi: int, same: Same, deadline: float = math.inf,
                        clock: Callable[[], float] = time.monotonic) -> tuple[int, bool]:
    """The first offset in [lo, hi) whose record is not the one stored there (hi if all are), and whether it is sure.

    The broker keeps a prefix of what it acknowledged and gives the following offsets to new
    records, so `same` holds below the answer and fails from it on: a binary search finds it in
    about log2(hi - lo) probes. Past `deadline` it answers `lo`, the end of the proven prefix.
    """
    certain = True
    while lo < hi:
        if clock() > deadline:
            return lo, False
        mid = (lo + hi) // 2
        answer = same(mid)
        if answer:
            lo = mid + 1
        else:
            certain = certain and answer is not None
            hi = mid
    return lo, certain
