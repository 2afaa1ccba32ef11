"""Per-rank iteration breakdown: total, collective-communication and compute time.

Keyed by job, so all of a job's ranks, reported by many nodes, meet on one worker; the state entry of a
rank ("job|rank") holds its hook collectives not yet behind an emitted iteration, its collective
watermark, its pending iterations and the end of its last emitted one.

Collectives and iterations arrive on different topics, in any order. An iteration is emitted as soon as
one of these holds, oldest first per rank:

- it says how many comm-hook collectives it launched (`collectives`) and that many distinct ones
  overlapping it are in: the last iteration of a job too;
- the rank's collectives are known to have reached its end (the rank's collective watermark: a later
  collective ended at or after it);
- `grace` further iterations of that rank are waiting (`max_pending` for one that gave its count: its
  collectives may just be late, e.g. while the collectives topic catches up on a backlog; the bound keeps
  a rank whose collectives were lost from holding iterations forever).

Only comm-hook collectives count (source "hook"): the flight recorder reports the same all-reduces again.
A redelivered collective (same communicator and seq) replaces itself instead of counting twice.

One row per iteration: an emitted iteration's collectives are pruned, so an iteration ending at or before
the rank's last emitted one (a redelivery, a spool replay, or one that arrived out of order) would come out
again with none and, the table being a ReplacingMergeTree, replace the right row. It is dropped and
counted in `late_iterations`; a copy of one still pending in `duplicate_iterations`. A hook collective
ending at or before that end is behind an emitted iteration: dropped (`late_collectives`), so a worker
that replays its last seconds over state that saw them changes nothing.

Bounded: a rank holds at most `max_collectives` collectives (a script that instruments DDP but never
marks iterations; the oldest, by end, are dropped and counted in `dropped_collectives`), and a rank idle
for `rank_ttl_ns` of event time expires: its pending iterations are emitted with what is at hand, counted
in `expired_ranks`. The state is written whole to the changelog after each batch that touches the rank,
so collectives are kept as (start, end, bytes) only and encoded by column, with deltas.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any, ClassVar, NamedTuple

import orjson

from clocktower.schemas.analytics import IterationBreakdown
from clocktower.schemas.event import Event
from clocktower.schemas.telemetry import CollectiveEvent, IterationEvent
from clocktower.streams.processor import Output, Processor

DEFAULT_RANK_TTL_NS = 3600 * 10**9
# A rank's encoded state must fit one changelog record (1 MiB, schemas/topics.py): at about 29 bytes per
# collective (tests/test_iteration_breakdown.py: gaps and durations up to 0.1 s, sizes up to 64 MiB) 16 Ki
# collectives are ~460 KiB; the 64 Ki of the node-keyed aggregator would not fit. A DDP iteration
# launches tens of bucket all-reduces, FSDP a few per layer.
DEFAULT_MAX_COLLECTIVES = 16_384

CollectiveKey = tuple[str, int]        # communicator, seq
Collective = tuple[int, int, int]      # start_ns, end_ns, bytes: all the breakdown needs

class PendingIteration(NamedTuple):
    """An iteration waiting for its collectives: the fields of IterationEvent the breakdown reads. A tuple, not
    the model: decoding a rank's pending iterations as models was 17 % of the worker's record handling (issue 19)."""

    node: str
    ts_ns: int
    job: str
    rank: int
    iteration: int
    start_ns: int
    end_ns: int
    collectives: int | None
    gpu: int | None = None   # a default: entries written before this field had 8 values
    world_size: int | None = None   # likewise (9 values)

    @classmethod
    def of(cls, it: IterationEvent) -> PendingIteration:
        return cls(it.node, it.ts_ns, it.job, it.rank, it.iteration, it.start_ns, it.end_ns, it.collectives, it.gpu,
                   it.world_size)



def _busy_ns(intervals: list[tuple[int, int]], lo: int, hi: int) -> int:
    """Length of the union of `intervals` clipped to [lo, hi]."""
    total, cur_s, cur_e = 0, 0, None
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
class RankState:
    """One rank's state entry."""

    # its hook collectives not yet behind an emitted iteration
    collectives: dict[CollectiveKey, Collective] = field(default_factory=dict)
    watermark: int = 0                 # latest end of its hook collectives
    pending: list[PendingIteration] = field(default_factory=list)
    emitted_end_ns: int | None = None  # end of its last emitted iteration
    last_ns: int = 0                   # newest event time of its events: it expires rank_ttl_ns after
    # its last RECENT rows, to emit again: field values in _ROW_FIELDS order, made into rows only when a replay
    # asks for them (a model per kept row on every decode was 6 % of a worker's time, issue 19)
    recent: list[list[Any]] = field(default_factory=list)


RECENT = 8   # rows kept per rank: a replay after a crash covers the seconds since the last commit
_ROW_FIELDS = tuple(IterationBreakdown.model_fields)
_ROW_START = _ROW_FIELDS.index("start_ns")


def _row_values(b: IterationBreakdown) -> list[Any]:
    return [getattr(b, f) for f in _ROW_FIELDS]


def _row(values: list[Any]) -> IterationBreakdown:
    """A kept row; one kept before a field was added lacks its value, and gets its default."""
    return IterationBreakdown.model_construct(**dict(zip(_ROW_FIELDS, values, strict=False)))


def rank_key(job: str, rank: int) -> str:
    return f"{job}|{rank}"


class IterationBreakdownJoin(Processor):
    name: ClassVar[str] = "iteration_breakdown"
    consumes: ClassVar[tuple[type[Event], ...]] = (CollectiveEvent, IterationEvent)
    key_by: ClassVar[str] = "job"

    def __init__(self, grace: int = 2, max_pending: int = 256, max_collectives: int = DEFAULT_MAX_COLLECTIVES,
                 rank_ttl_ns: int = DEFAULT_RANK_TTL_NS) -> None:
        self.grace = grace
        self.max_pending = max_pending
        self.max_collectives = max_collectives
        self.state_ttl_ns = rank_ttl_ns
        self.late_iterations = 0       # dropped: at or before the rank's last emitted iteration
        self.duplicate_iterations = 0  # dropped: a copy of one still pending
        self.late_collectives = 0      # dropped: at or before the rank's last emitted iteration
        self.dropped_collectives = 0   # dropped: over max_collectives for their rank
        self.expired_ranks = 0         # ranks idle for rank_ttl_ns: their pending iterations emitted as they were
        self.reemitted = 0             # late iterations whose row was emitted again (a replay after a crash)

    def counters(self) -> dict[str, int]:
        return {"late_iterations": self.late_iterations, "duplicate_iterations": self.duplicate_iterations,
                "late_collectives": self.late_collectives, "dropped_collectives": self.dropped_collectives,
                "expired_ranks": self.expired_ranks, "reemitted_iterations": self.reemitted}

    def partition_key(self, event: Event) -> str:
        assert isinstance(event, CollectiveEvent | IterationEvent)
        return event.job

    def process(self, state: Any, event: Event) -> list[Output]:
        if isinstance(event, CollectiveEvent):
            return self._add_collective(state, event)
        assert isinstance(event, IterationEvent)
        return self._add_iteration(state, event)

    def _add_collective(self, state: Any, c: CollectiveEvent) -> list[Output]:
        if c.source != "hook":
            return []
        key = rank_key(c.job, c.rank)
        r: RankState = state.get(key) or RankState()
        value = (c.start_ns, c.end_ns, c.bytes)
        if r.emitted_end_ns is not None and c.end_ns <= r.emitted_end_ns:
            self.late_collectives += 1
            return self._again(r, c.end_ns)
        if r.collectives.get((c.communicator, c.seq)) == value:
            return []                  # redelivered while its iteration waits: nothing changes
        r.collectives[(c.communicator, c.seq)] = value
        r.watermark = max(r.watermark, c.end_ns)
        if len(r.collectives) > self.max_collectives:
            self._trim(r)
        out = self._release(r)
        self._put(state, key, r, c.ts_ns)
        return list(out)

    def _add_iteration(self, state: Any, it: IterationEvent) -> list[Output]:
        key = rank_key(it.job, it.rank)
        r: RankState = state.get(key) or RankState()
        if r.emitted_end_ns is not None and it.end_ns <= r.emitted_end_ns:
            # The state may be ahead of the outputs after a crash (it is written at once, the rows at the next
            # commit): a replayed iteration that was emitted gives its row again; the table collapses copies.
            again = self._again(r, it.end_ns)
            if any(b.iteration == it.iteration and b.start_ns == it.start_ns for b in again):
                self.reemitted += 1
            else:
                self.late_iterations += 1
            return again
        if any(p.iteration == it.iteration and p.start_ns == it.start_ns for p in r.pending):
            self.duplicate_iterations += 1
            return self._again(r, it.end_ns)   # its first arrival may have released earlier rows
        r.pending.append(PendingIteration.of(it))
        out = self._release(r)
        self._put(state, key, r, it.ts_ns)
        return list(out)

    @staticmethod
    def _again(r: RankState, end_ns: int) -> list[Output]:
        """The rank's recent rows that an event ending at `end_ns` may have released when it first came: every
        one that began before it ended (the iteration it completed overlaps it; earlier ones it let go).

        After a kill -9 the state can be ahead of the outputs (rocksdb is written at once, the rows at the
        next commit), so a redelivered collective or iteration gives those rows again; the
        ReplacingMergeTree collapses the copies. A superset is harmless; a row missed is lost."""
        return [_row(v) for v in r.recent if v[_ROW_START] < end_ns]

    def _put(self, state: Any, key: str, r: RankState, ts_ns: int) -> None:
        r.last_ns = max(r.last_ns, ts_ns)
        state.put(key, r, r.last_ns + self.state_ttl_ns)

    def on_expired(self, expired: list[tuple[str, Any]]) -> list[Output]:
        out: list[Output] = []
        for _, r in expired:
            if r is None:
                continue
            self.expired_ranks += 1
            out += [self._breakdown(r, it) for it in sorted(r.pending, key=lambda i: i.end_ns)]
        return out

    def _trim(self, r: RankState) -> None:
        """Drop the oldest collectives (by end, then key: the same whatever the batches were) down to 7/8 of
        the cap: one sort per cap/8 additions."""
        keep = self.max_collectives - self.max_collectives // 8
        by_end = sorted(r.collectives.items(), key=lambda kv: (kv[1][1], kv[0]))
        self.dropped_collectives += len(by_end) - keep
        r.collectives = dict(by_end[len(by_end) - keep:])

    def _release(self, r: RankState) -> list[IterationBreakdown]:
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
            r.collectives = {k: c for k, c in r.collectives.items() if c[1] > done}
            r.recent = (r.recent + [_row_values(b) for b in out[-RECENT:]])[-RECENT:]
        return out

    @staticmethod
    def _overlapping(r: RankState, it: PendingIteration) -> list[Collective]:
        return [c for c in r.collectives.values() if c[1] > it.start_ns and c[0] < it.end_ns]

    def _patience(self, it: PendingIteration) -> int:
        """How many later iterations of its rank may wait behind `it` before it is emitted anyway."""
        return self.grace if it.collectives is None else self.max_pending

    def _has_all(self, r: RankState, it: PendingIteration) -> bool:
        """Whether every collective the iteration says it launched is in."""
        return it.collectives is not None and len(self._overlapping(r, it)) >= it.collectives

    def _breakdown(self, r: RankState, it: PendingIteration) -> IterationBreakdown:
        cols = self._overlapping(r, it)
        duration = it.end_ns - it.start_ns
        comm = _busy_ns([(s, e) for s, e, _ in cols], it.start_ns, it.end_ns)
        return IterationBreakdown.model_construct(
            node=it.node, ts_ns=it.end_ns, job=it.job, rank=it.rank, iteration=it.iteration,
            start_ns=it.start_ns, end_ns=it.end_ns, duration_ns=duration, comm_ns=comm,
            compute_ns=duration - comm, collectives=len(cols), comm_bytes=sum(b for _, _, b in cols), gpu=it.gpu,
            world_size=it.world_size,
        )

    def encode_state(self, value: RankState) -> bytes:
        pending = [list(it) for it in value.pending]
        return orjson.dumps([value.watermark, value.emitted_end_ns, value.last_ns, pending,
                             _pack_collectives(value.collectives), value.recent])

    def decode_state(self, data: bytes) -> RankState:
        watermark, emitted_end, last_ns, pending, packed, *rest = orjson.loads(data)
        its = [PendingIteration(*row) for row in pending]
        return RankState(_unpack_collectives(packed), watermark, its, emitted_end, last_ns, rest[0] if rest else [])


def _pack_collectives(cols: dict[CollectiveKey, Collective]) -> list[list[Any]]:
    """Per communicator, in seq order: [communicator, seq deltas, start deltas, durations, bytes]."""
    by_comm: dict[str, list[tuple[int, Collective]]] = {}
    for (comm, seq), c in cols.items():
        by_comm.setdefault(comm, []).append((seq, c))
    packed = []
    for comm, rows in by_comm.items():
        rows.sort()
        seqs = [seq for seq, _ in rows]
        starts = [c[0] for _, c in rows]
        packed.append([comm, _deltas(seqs), _deltas(starts), [c[1] - c[0] for _, c in rows], [c[2] for _, c in rows]])
    return packed


def _unpack_collectives(packed: list[list[Any]]) -> dict[CollectiveKey, Collective]:
    out: dict[CollectiveKey, Collective] = {}
    for comm, dseq, dstart, durations, sizes in packed:
        for seq, start, dur, size in zip(accumulate(dseq), accumulate(dstart), durations, sizes, strict=True):
            out[(comm, seq)] = (start, start + dur, size)
    return out


def _deltas(xs: list[int]) -> list[int]:
    return [b - a for a, b in zip([0, *xs], xs, strict=False)]
