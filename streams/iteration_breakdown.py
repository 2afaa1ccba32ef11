"""Per-rank iteration breakdown: total, collective-communication and compute time.

Collectives and iterations arrive on different topics, in any order. An
iteration is emitted once the rank's collectives are known to have reached
its end (the rank's collective watermark), or after `grace` further
iterations of that rank, whichever is first.
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
    def __init__(self, grace: int = 2) -> None:
        self.grace = grace
        self.collectives: dict[RankKey, list[CollectiveEvent]] = defaultdict(list)
        self.watermark: dict[RankKey, int] = {}
        self.pending: dict[RankKey, list[IterationEvent]] = defaultdict(list)

    def add_collective(self, c: CollectiveEvent) -> list[IterationBreakdown]:
        key = (c.job, c.rank)
        self.collectives[key].append(c)
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
        while pend and (pend[0].end_ns <= mark or len(pend) > self.grace):
            out.append(self._breakdown(pend.pop(0)))
        if out:
            done = out[-1].end_ns
            self.collectives[key] = [c for c in self.collectives[key] if c.end_ns > done]
        return out

    def _breakdown(self, it: IterationEvent) -> IterationBreakdown:
        cols = [c for c in self.collectives.get((it.job, it.rank), ()) if c.end_ns > it.start_ns
                and c.start_ns < it.end_ns]
        duration = it.end_ns - it.start_ns
        comm = _busy_ns([(c.start_ns, c.end_ns) for c in cols], it.start_ns, it.end_ns)
        return IterationBreakdown.model_construct(
            node=it.node, ts_ns=it.end_ns, job=it.job, rank=it.rank, iteration=it.iteration,
            start_ns=it.start_ns, end_ns=it.end_ns, duration_ns=duration, comm_ns=comm,
            compute_ns=duration - comm, collectives=len(cols), comm_bytes=sum(c.bytes for c in cols),
        )
