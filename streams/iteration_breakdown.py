"""Per-rank iteration breakdown: total, collective-communication and compute time.

Collectives and iterations arrive on different topics, in any order. An
iteration is emitted as soon as one of these holds, oldest first per rank:

- it says how many comm-hook collectives it launched (`collectives`) and that
  many distinct ones overlapping it are in: the last iteration of a job too;
- the rank's collectives are known to have reached its end (the rank's
  collective watermark: a later collective ended at or after it);
- `grace` further iterations of that rank are waiting (`max_pending` for one
  that gave its count: its collectives may just be late, e.g. while the
  collectives topic catches up on a backlog; the bound keeps a rank whose
  collectives were lost from holding iterations forever).

Only comm-hook collectives count (source "hook"): the flight recorder reports
the same all-reduces again. A redelivered collective (same communicator and
seq) replaces itself instead of counting twice.
"""

from __future__ import annotations

from collections import defaultdict

from clocktower.schemas.analytics import IterationBreakdown
from clocktower.schemas.telemetry import CollectiveEvent, IterationEvent

RankKey = tuple[str, int]


def _busy_ns(intervals: list[tuple[int, int]], lo: int, hi: int) -> int:
    """Length of the union of `intervals` clipped to [lo, hi]."""
    total, cur_s, cur_e = 0, None, None
    for s, e in sorted((max(s, lo), min(e, hi)) for s, e in intervals if e > lo and s < hi):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


class IterationBreakdownAggregator:
    def __init__(self, grace: int = 2, max_pending: int = 256) -> None:
        self.grace = grace
        self.max_pending = max_pending
        # per rank, its hook collectives not yet behind an emitted iteration, by (communicator, seq)
        self.collectives: dict[RankKey, dict[tuple[str, int], CollectiveEvent]] = defaultdict(dict)
        self.watermark: dict[RankKey, int] = {}
        self.pending: dict[RankKey, list[IterationEvent]] = defaultdict(list)

    def add_collective(self, c: CollectiveEvent) -> list[IterationBreakdown]:
        if c.source != "hook":
            return []
        key = (c.job, c.rank)
        self.collectives[key][(c.communicator, c.seq)] = c
        self.watermark[key] = max(self.watermark.get(key, 0), c.end_ns)
        return self._release(key)

    def add_iteration(self, it: IterationEvent) -> list[IterationBreakdown]:
        key = (it.job, it.rank)
        self.pending[key].append(it)
        return self._release(key)

    def _release(self, key: RankKey) -> list[IterationBreakdown]:
        pend = self.pending.get(key)
        if not pend:
            return []
        pend.sort(key=lambda i: i.end_ns)
        mark = self.watermark.get(key, 0)
        out = []
        while pend and (len(pend) > self._patience(pend[0]) or pend[0].end_ns <= mark or self._has_all(pend[0])):
            out.append(self._breakdown(pend.pop(0)))
        if out:
            done = out[-1].end_ns
            cols = self.collectives[key]
            self.collectives[key] = {k: c for k, c in cols.items() if c.end_ns > done}
        return out

    def _overlapping(self, it: IterationEvent) -> list[CollectiveEvent]:
        cols = self.collectives.get((it.job, it.rank), {})
        return [c for c in cols.values() if c.end_ns > it.start_ns and c.start_ns < it.end_ns]

    def _patience(self, it: IterationEvent) -> int:
        """How many later iterations of its rank may wait behind `it` before it is emitted anyway."""
        return self.grace if it.collectives is None else self.max_pending

    def _has_all(self, it: IterationEvent) -> bool:
        """Whether every collective the iteration says it launched is in."""
        return it.collectives is not None and len(self._overlapping(it)) >= it.collectives

    def _breakdown(self, it: IterationEvent) -> IterationBreakdown:
        cols = self._overlapping(it)
        duration = it.end_ns - it.start_ns
        comm = _busy_ns([(c.start_ns, c.end_ns) for c in cols], it.start_ns, it.end_ns)
        return IterationBreakdown.model_construct(
            node=it.node, ts_ns=it.end_ns, job=it.job, rank=it.rank, iteration=it.iteration,
            start_ns=it.start_ns, end_ns=it.end_ns, duration_ns=duration, comm_ns=comm,
            compute_ns=duration - comm, collectives=len(cols), comm_bytes=sum(c.bytes for c in cols),
        )
