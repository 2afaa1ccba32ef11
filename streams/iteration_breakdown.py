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

One row per iteration: an emitted iteration's collectives are pruned, so an
iteration ending at or before the rank's last emitted one (a redelivery, a spool
replay, or one that arrived out of order) would come out again with none and,
the table being a ReplacingMergeTree, replace the right row. It is dropped and
counted in `late_iterations`; a copy of one still pending in
`duplicate_iterations`.

Bounded: a rank holds at most `max_collectives` collectives (a script that
instruments DDP but never marks iterations; the oldest, by end, are dropped and
counted in `dropped_collectives`), and at most `max_ranks` ranks are tracked
(the least recently active one is evicted: its pending iterations are emitted
with what is at hand, counted in `evicted_ranks`). The last emitted end of up to
`max_ranks` evicted ranks is kept, so one that comes back with a redelivered
iteration still drops it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

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


@dataclass
class _Rank:
    """One rank's state."""

    # its hook collectives not yet behind an emitted iteration, by (communicator, seq)
    collectives: dict[tuple[str, int], CollectiveEvent] = field(default_factory=dict)
    watermark: int = 0                 # latest end of its hook collectives
    pending: list[IterationEvent] = field(default_factory=list)
    emitted_end_ns: int | None = None  # end of its last emitted iteration


class IterationBreakdownAggregator:
    def __init__(self, grace: int = 2, max_pending: int = 256, max_collectives: int = 65_536,
                 max_ranks: int = 65_536) -> None:
        self.grace = grace
        self.max_pending = max_pending
        self.max_collectives = max_collectives
        self.max_ranks = max_ranks
        self.ranks: OrderedDict[RankKey, _Rank] = OrderedDict()   # least recently active first
        self._evicted_ends: OrderedDict[RankKey, int] = OrderedDict()   # evicted ranks' last emitted end
        self.late_iterations = 0       # dropped: at or before the rank's last emitted iteration
        self.duplicate_iterations = 0  # dropped: a copy of one still pending
        self.dropped_collectives = 0   # dropped: over max_collectives for their rank
        self.evicted_ranks = 0         # ranks evicted over max_ranks

    def add_collective(self, c: CollectiveEvent) -> list[IterationBreakdown]:
        if c.source != "hook":
            return []
        out, r = self._rank((c.job, c.rank))
        r.collectives[(c.communicator, c.seq)] = c
        r.watermark = max(r.watermark, c.end_ns)
        if len(r.collectives) > self.max_collectives:
            self._trim(r)
        return out + self._release(r)

    def add_iteration(self, it: IterationEvent) -> list[IterationBreakdown]:
        out, r = self._rank((it.job, it.rank))
        if r.emitted_end_ns is not None and it.end_ns <= r.emitted_end_ns:
            self.late_iterations += 1
            return out
        if any(p.iteration == it.iteration and p.start_ns == it.start_ns for p in r.pending):
            self.duplicate_iterations += 1
            return out
        r.pending.append(it)
        return out + self._release(r)

    def _rank(self, key: RankKey) -> tuple[list[IterationBreakdown], _Rank]:
        """The rank's state, marked most recently active; and what evicting the least active one emitted."""
        r = self.ranks.get(key)
        if r is not None:
            self.ranks.move_to_end(key)
            return [], r
        out: list[IterationBreakdown] = []
        returning_end = self._evicted_ends.pop(key, None)
        while len(self.ranks) >= self.max_ranks:
            old_key, old = self.ranks.popitem(last=False)
            self.evicted_ranks += 1
            emitted = [self._breakdown(old, i) for i in sorted(old.pending, key=lambda i: i.end_ns)]
            out += emitted
            end = emitted[-1].end_ns if emitted else old.emitted_end_ns
            if end is not None:
                self._evicted_ends[old_key] = max(end, old.emitted_end_ns or end)
                while len(self._evicted_ends) > self.max_ranks:
                    self._evicted_ends.popitem(last=False)
        r = self.ranks[key] = _Rank(emitted_end_ns=returning_end)
        return out, r

    def _trim(self, r: _Rank) -> None:
        """Drop the oldest collectives (by end) down to 7/8 of the cap: one sort per cap/8 additions."""
        keep = self.max_collectives - self.max_collectives // 8
        by_end = sorted(r.collectives.items(), key=lambda kv: kv[1].end_ns)
        self.dropped_collectives += len(by_end) - keep
        r.collectives = dict(by_end[len(by_end) - keep:])

    def _release(self, r: _Rank) -> list[IterationBreakdown]:
        pend = r.pending
        if not pend:
            return []
        pend.sort(key=lambda i: i.end_ns)
        out = []
        while pend and (len(pend) > self._patience(pend[0]) or pend[0].end_ns <= r.watermark
                        or self._has_all(r, pend[0])):
            out.append(self._breakdown(r, pend.pop(0)))
        if out:
            done = r.emitted_end_ns = out[-1].end_ns
            r.collectives = {k: c for k, c in r.collectives.items() if c.end_ns > done}
        return out

    @staticmethod
    def _overlapping(r: _Rank, it: IterationEvent) -> list[CollectiveEvent]:
        return [c for c in r.collectives.values() if c.end_ns > it.start_ns and c.start_ns < it.end_ns]

    def _patience(self, it: IterationEvent) -> int:
        """How many later iterations of its rank may wait behind `it` before it is emitted anyway."""
        return self.grace if it.collectives is None else self.max_pending

    def _has_all(self, r: _Rank, it: IterationEvent) -> bool:
        """Whether every collective the iteration says it launched is in."""
        return it.collectives is not None and len(self._overlapping(r, it)) >= it.collectives

    def _breakdown(self, r: _Rank, it: IterationEvent) -> IterationBreakdown:
        cols = self._overlapping(r, it)
        duration = it.end_ns - it.start_ns
        comm = _busy_ns([(c.start_ns, c.end_ns) for c in cols], it.start_ns, it.end_ns)
        return IterationBreakdown.model_construct(
            node=it.node, ts_ns=it.end_ns, job=it.job, rank=it.rank, iteration=it.iteration,
            start_ns=it.start_ns, end_ns=it.end_ns, duration_ns=duration, comm_ns=comm,
            compute_ns=duration - comm, collectives=len(cols), comm_bytes=sum(c.bytes for c in cols),
        )
