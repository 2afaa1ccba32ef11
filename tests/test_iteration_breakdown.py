"""The iteration-breakdown join on the processor contract: the release rules, its state's codec and bounds,
and idempotence when a worker replays what its state already saw.

Most tests feed one event per runner batch, so every event decodes the rank's state from bytes and
encodes it back: the rules are checked across the codec round trip, as a worker runs them."""

from __future__ import annotations

import random

from clocktower.schemas.analytics import IterationBreakdown
from clocktower.schemas.event import Event
from clocktower.schemas.telemetry import CollectiveEvent, IterationEvent
from clocktower.schemas.topics import MAX_RECORD_BYTES
from clocktower.streams.joins.iteration_breakdown import (
    DEFAULT_MAX_COLLECTIVES,
    IterationBreakdownJoin,
    PendingIteration,
    RankState,
)
from clocktower.streams.processor import partition_of
from clocktower.streams.processor_runner import ProcessorRunner

T0 = 1_780_000_000 * 10**9
S = 10**9


def coll(start: int, end: int, seq: int, rank: int = 0, source: str = "hook", job: str = "j") -> CollectiveEvent:
    communicator = "fr:default" if source == "flight_recorder" else "world"
    return CollectiveEvent(node="node-0", ts_ns=end, job=job, rank=rank, communicator=communicator, op="allreduce",
                           seq=seq, bytes=100, start_ns=start, end_ns=end, source=source)


def it(i: int, start: int, end: int, rank: int = 0, collectives: int | None = None, job: str = "j") -> IterationEvent:
    return IterationEvent(node="node-0", ts_ns=end, job=job, rank=rank, iteration=i, start_ns=start, end_ns=end,
                          collectives=collectives)


class Rig:
    """The join on the in-memory runner; each call is one batch of partition 0."""

    def __init__(self, **kw: int) -> None:
        self.join = IterationBreakdownJoin(**kw)
        self.runner = ProcessorRunner(self.join)

    def __call__(self, *events: Event) -> list[IterationBreakdown]:
        out: list[IterationBreakdown] = []
        for e in events:
            out += self.runner.run(0, [e])   # type: ignore[arg-type]
        return out

    def rank(self, rank: int, job: str = "j") -> RankState | None:
        return self.runner.store.get(f"{job}|{rank}")


def test_breakdown_waits_for_collectives_then_merges_overlaps() -> None:
    agg = Rig()
    assert agg(it(0, T0, T0 + 100)) == []          # collectives not seen yet
    assert agg(coll(T0 + 60, T0 + 80, 1)) == []    # watermark 80 < 100
    out = agg(coll(T0 + 70, T0 + 100, 2))          # overlaps: union is 60..100
    assert len(out) == 1
    b = out[0]
    assert (b.duration_ns, b.comm_ns, b.compute_ns, b.collectives, b.comm_bytes) == (100, 40, 60, 2, 200)
    # the next iteration's collectives arrived first: still counted only for their own iteration
    agg(coll(T0 + 150, T0 + 190, 3))
    out = agg(it(1, T0 + 100, T0 + 190))
    assert out[0].comm_ns == 40 and out[0].collectives == 1


def test_breakdown_gives_up_waiting_after_grace() -> None:
    agg = Rig(grace=2)
    assert agg(it(0, T0, T0 + 100)) == []
    assert agg(it(1, T0 + 100, T0 + 200)) == []
    out = agg(it(2, T0 + 200, T0 + 300))
    assert [b.iteration for b in out] == [0] and out[0].comm_ns == 0


def test_breakdown_emits_the_last_iteration_once_its_collectives_are_in() -> None:
    """The job's last iteration has no later collective to push the watermark past its end (issue 9 item 2)."""
    agg = Rig()
    out = agg(coll(T0 + 60, T0 + 80, 0), coll(T0 + 80, T0 + 95, 1))
    out += agg(it(0, T0, T0 + 100, collectives=2))   # the job ends here: nothing comes after
    assert [(b.iteration, b.collectives, b.comm_ns) for b in out] == [(0, 2, 35)]
    # iteration first: it waits until it holds the 2 collectives it launched, then closes at once
    assert agg(it(1, T0 + 100, T0 + 200, collectives=2)) == []
    assert agg(coll(T0 + 150, T0 + 170, 2)) == []
    assert agg(coll(T0 + 150, T0 + 170, 2)) == []                 # redelivered: counted once
    out = agg(coll(T0 + 170, T0 + 190, 3))
    assert [(b.iteration, b.collectives, b.comm_bytes) for b in out] == [(1, 2, 200)]
    # an iteration that launched none closes at once
    assert [b.iteration for b in agg(it(2, T0 + 200, T0 + 300, collectives=0))] == [2]


def test_breakdown_waits_longer_for_counted_collectives_but_not_forever() -> None:
    agg = Rig(grace=2, max_pending=4)
    out = agg(*(it(i, T0 + 100 * i, T0 + 100 * i + 90, collectives=1) for i in range(4)))
    assert out == []                                        # 3 waiting behind iteration 0: its collective may come
    out = agg(it(4, T0 + 400, T0 + 490, collectives=1))
    assert [(b.iteration, b.collectives) for b in out] == [(0, 0)]     # lost: emitted without it


def test_breakdown_counts_each_collective_once_with_the_flight_recorder_on() -> None:
    """The flight recorder reports the hook's all-reduces again: only the hook's count, nor move the watermark."""
    agg = Rig()
    agg(coll(T0 + 60, T0 + 80, 0))
    agg(coll(T0 + 60, T0 + 60, 1, source="flight_recorder"))     # the same all-reduce, from FR
    agg(coll(T0 + 120, T0 + 120, 2, source="flight_recorder"))   # FR watermark: not the hook's
    assert agg(it(0, T0, T0 + 100)) == []
    out = agg(coll(T0 + 100, T0 + 130, 1))
    assert [(b.iteration, b.collectives, b.comm_bytes, b.comm_ns) for b in out] == [(0, 1, 100, 20)]


def test_a_redelivered_iteration_never_replaces_its_row() -> None:
    """A redelivered iteration came out again as (0, 0, 0) after its collectives were pruned. Now it gives its
    row again, identical (the state may have been ahead of the outputs when a worker died); one too old for the
    rank's recent rows is dropped and counted."""
    agg = Rig()
    agg(coll(T0 + 100, T0 + 150, 0))
    out = agg(it(0, T0, T0 + 200, collectives=1))
    assert [(b.iteration, b.collectives, b.comm_ns) for b in out] == [(0, 1, 50)]
    assert agg(it(0, T0, T0 + 200, collectives=1)) == out         # Kafka redelivery, spool replay: the same row
    assert agg(coll(T0 + 250, T0 + 260, 1)) == []                 # the next iteration's collective
    assert agg.join.reemitted == 1 and agg.join.late_iterations == 0
    for i in range(1, 10):                                        # 9 more rows push iteration 0 out of `recent`
        agg(coll(T0 + 200 * i + 50, T0 + 200 * i + 60, i + 1))
        agg(it(i, T0 + 200 * i, T0 + 200 * i + 200, collectives=1))
    assert agg(it(0, T0, T0 + 200, collectives=1)) == [] and agg.join.late_iterations == 1


def test_a_duplicate_of_a_pending_iteration_gives_one_row() -> None:
    agg = Rig()
    assert agg(it(0, T0, T0 + 200, collectives=1)) == []
    assert agg(it(0, T0, T0 + 200, collectives=1)) == []
    out = agg(coll(T0 + 100, T0 + 150, 0))
    assert [(b.iteration, b.collectives, b.comm_ns) for b in out] == [(0, 1, 50)]
    assert agg.join.duplicate_iterations == 1


def test_an_iteration_arriving_after_a_later_one_is_dropped_not_emitted_empty() -> None:
    agg = Rig()
    agg(coll(T0 + 100, T0 + 150, 0))                             # iteration 0's collective
    agg(coll(T0 + 300, T0 + 350, 1))
    out = agg(it(1, T0 + 200, T0 + 400, collectives=1))          # 1 before 0
    assert [(b.iteration, b.collectives) for b in out] == [(1, 1)]
    assert agg(it(0, T0, T0 + 200, collectives=1)) == []          # its collective is gone
    assert agg.join.late_iterations == 1


def test_a_collective_behind_an_emitted_iteration_changes_nothing() -> None:
    """Redelivered after its iteration came out, it would sit in the state until the rank expired: the state
    stays as it was, and it only gives the row it may have released again (the table collapses the copy)."""
    agg = Rig()
    agg(coll(T0 + 100, T0 + 150, 0))
    [row] = agg(it(0, T0, T0 + 200, collectives=1))
    before = dict(agg.runner.store.backing)
    assert agg(coll(T0 + 100, T0 + 150, 0)) == [row]
    assert agg.runner.store.backing == before and agg.join.late_collectives == 1


def test_collectives_without_iterations_are_bounded() -> None:
    """A script that instruments DDP but never marks iterations: a rank holds at most max_collectives."""
    agg = Rig(max_collectives=64)
    agg(*(coll(T0 + 10 * s, T0 + 10 * s + 5, s) for s in range(1000)))
    r = agg.rank(0)
    assert r is not None
    held = r.collectives
    assert len(held) <= 64 and agg.join.dropped_collectives == 1000 - len(held)
    assert min(seq for _, seq in held) == 1000 - len(held)                # the oldest were dropped
    out = agg(it(999, T0 + 9990, T0 + 9996, collectives=1))
    assert [(b.iteration, b.collectives) for b in out] == [(999, 1)]


def test_an_idle_rank_expires_and_emits_what_it_held() -> None:
    """Replaces the max_ranks LRU: a rank silent for rank_ttl_ns of event time goes, its pending iterations out."""
    agg = Rig(rank_ttl_ns=10 * S)
    assert agg(it(0, T0, T0 + 100, rank=0, collectives=1)) == []          # waits for its collective
    agg(coll(T0 + 10, T0 + 20, 0, rank=1))
    assert agg(coll(T0 + 9 * S, T0 + 9 * S + 10, 1, rank=1)) == []        # rank 1 active, rank 0 not yet 10 s idle
    assert agg.join.expired_ranks == 0 and agg.rank(0) is not None
    out = agg(coll(T0 + 11 * S, T0 + 11 * S + 10, 2, rank=1))             # event time past rank 0's expiry
    assert [(b.rank, b.iteration, b.collectives) for b in out] == [(0, 0, 0)]
    assert agg.join.expired_ranks == 1 and agg.rank(0) is None and agg.rank(1) is not None
    assert len(agg.runner.store) == 1


def test_an_older_event_does_not_shorten_a_ranks_life() -> None:
    """The expiry follows the rank's newest event time: a late or redelivered older event does not pull it in."""
    agg = Rig(rank_ttl_ns=10 * S)
    agg(it(0, T0 + 5 * S, T0 + 6 * S, rank=0, collectives=2))
    agg(coll(T0 + 5 * S, T0 + 5 * S + 10, 0, rank=0))                    # an older one: ts before the iteration's
    agg(coll(T0 + 15 * S, T0 + 15 * S + 10, 0, rank=1))                  # event time T0 + 15 s: < T0 + 6 s + 10 s
    assert agg.join.expired_ranks == 0 and agg.rank(0) is not None


def test_the_state_round_trips_through_its_codec() -> None:
    join = IterationBreakdownJoin()
    pending = [PendingIteration.of(it(7, T0, T0 + 100)), PendingIteration.of(it(8, T0 + 100, T0 + 200, collectives=3))]
    cols = {("world", 5): (T0 + 1, T0 + 9, 2**40), ("world", 3): (T0 + 5, T0 + 7, 8),
            ("sub", 2**63): (T0 + 50, T0 + 50, 0)}
    r = RankState(collectives=cols, watermark=T0 + 50, pending=pending, emitted_end_ns=T0 - 1, last_ns=T0 + 200)
    back = join.decode_state(join.encode_state(r))
    assert back.collectives == cols and back.pending == pending
    assert (back.watermark, back.emitted_end_ns, back.last_ns) == (T0 + 50, T0 - 1, T0 + 200)
    empty = join.decode_state(join.encode_state(RankState()))
    assert empty == RankState()


def test_a_full_rank_fits_one_changelog_record() -> None:
    """A rank's state is written whole after each batch that touches it: at the cap it must still fit."""
    rnd = random.Random(3)
    join = IterationBreakdownJoin()
    start, cols = T0, {}
    for seq in range(DEFAULT_MAX_COLLECTIVES):
        start += rnd.randrange(10**5, 10**8)
        cols[("default", seq)] = (start, start + rnd.randrange(10**4, 10**8), rnd.randrange(2**20, 2**26))
    r = RankState(collectives=cols, watermark=start, pending=[it(i, T0, T0 + i) for i in range(256)])
    size = len(join.encode_state(r))
    assert size < MAX_RECORD_BYTES / 2, size
    assert size / DEFAULT_MAX_COLLECTIVES < 32             # ~210 as model_dump()s, ~120 as lists of values


def test_state_keys_fall_in_the_partition_of_the_event() -> None:
    join = IterationBreakdownJoin()
    runner = ProcessorRunner(join)
    events = [coll(T0, T0 + 5, 0, rank=3, job="a|b"), it(0, T0, T0 + 10, rank=4, job="x")]
    runner.run(0, events)
    assert {join.partition_key(e) for e in events} == {"a|b", "x"}
    assert sorted(runner.store.backing) == [b"a|b|3", b"x|4"]


def _simulated() -> tuple[list[Event], list[IterationEvent], list[CollectiveEvent]]:
    from clocktower.producers.simulator import FleetSimulator, SimConfig

    sim = FleetSimulator(SimConfig(nodes=2, duration_s=3, seed=5))
    events = sim.advance(sim.now_ns + 3 * S)
    its = [e for e in events if isinstance(e, IterationEvent)]
    cols = [e for e in events if isinstance(e, CollectiveEvent)]
    assert len({e.rank for e in its}) > 1 and all(e.collectives for e in its)
    return events, its, cols


def _rank_it(e: IterationEvent | IterationBreakdown) -> tuple[int, int]:
    return e.rank, e.iteration


def test_every_simulated_iteration_gets_a_breakdown_in_either_topic_order() -> None:
    """The demo lost each rank's last iteration: N iterations must give N breakdowns, in one batch or many."""
    events, its, cols = _simulated()
    for order in (events, its + cols, cols + its):
        for batch in (len(order), 7, 1):
            runner = ProcessorRunner(IterationBreakdownJoin())
            out: list[Event] = []
            for i in range(0, len(order), batch):
                out += runner.run(0, order[i:i + batch])
            got = sorted((e for e in out if isinstance(e, IterationBreakdown)), key=_rank_it)
            assert [_rank_it(b) for b in got] == sorted(_rank_it(i) for i in its)
            assert [b.collectives for b in got] == [i.collectives for i in sorted(its, key=_rank_it)]


def test_n_workers_give_the_answers_of_one() -> None:
    """Three jobs over 4 partitions, run by one worker and by two that split the partitions."""
    events, _, _ = _simulated()
    jobs = [e.model_copy(update={"job": f"{e.job}-{n}"}) for n in range(3)  # type: ignore[attr-defined]
            for e in events if isinstance(e, IterationEvent | CollectiveEvent)]
    join = IterationBreakdownJoin()
    by_part: dict[int, list[Event]] = {}
    for e in jobs:
        by_part.setdefault(partition_of(join.partition_key(e), 4), []).append(e)
    assert len(by_part) > 1

    def run(workers: int) -> list[tuple[str, int, int, int, int]]:
        runners = [ProcessorRunner(IterationBreakdownJoin()) for _ in range(workers)]
        out: list[Event] = []
        for p, evs in sorted(by_part.items()):
            for i in range(0, len(evs), 5):
                out += runners[p % workers].run(p, evs[i:i + 5])
        return sorted((b.job, b.rank, b.iteration, b.comm_ns, b.comm_bytes) for b in out  # type: ignore[attr-defined]
                      if isinstance(b, IterationBreakdown))

    one = run(1)
    assert len(one) == 3 * sum(isinstance(e, IterationEvent) for e in events)
    assert run(2) == one


def test_a_worker_replaying_its_last_events_changes_nothing() -> None:
    """kill -9 and restart: events k..n come again over state that saw them: no new rows (only the same rows
    again, which the ReplacingMergeTree collapses), the same state."""
    events, its, _ = _simulated()
    for k in (0, len(events) // 3, len(events) - 10):
        runner = ProcessorRunner(IterationBreakdownJoin())
        first = [e for i in range(0, len(events), 10) for e in runner.run(0, events[i:i + 10])]
        assert len([e for e in first if isinstance(e, IterationBreakdown)]) == len(its)
        state = dict(runner.store.backing)
        again = [e for i in range(k, len(events), 10) for e in runner.run(0, events[i:i + 10])]
        assert set(map(repr, again)) <= set(map(repr, first)), k
        assert runner.store.backing == state, k


def test_a_replay_before_the_rows_came_out_gives_the_same_rows() -> None:
    """Replayed over state that saw the events but still holds their iterations: rows come out once, the same."""
    agg = Rig()
    events: list[Event] = [it(0, T0, T0 + 200, collectives=2), coll(T0 + 100, T0 + 150, 0),
                           it(1, T0 + 200, T0 + 400, collectives=1), coll(T0 + 300, T0 + 350, 1)]
    assert agg(*events[:3]) == []
    state = dict(agg.runner.store.backing)
    assert agg(*events[:3]) == [] and agg.runner.store.backing == state
    out = agg(coll(T0 + 150, T0 + 190, 2), events[3])
    again = agg(*events)
    assert [(b.iteration, b.collectives) for b in out] == [(0, 2), (1, 1)]
    assert set(map(repr, again)) == set(map(repr, out))   # the same rows again (the table collapses copies)


def test_a_replayed_collective_that_released_a_row_gives_it_again() -> None:
    """Killed after the state saw the collective that completed iteration 0 but before its row was sent."""
    agg = Rig()
    agg(it(0, T0, T0 + 200, collectives=1))
    [row] = agg(coll(T0 + 100, T0 + 150, 0))
    assert agg(coll(T0 + 100, T0 + 150, 0)) == [row]


def test_a_replayed_iteration_that_released_an_earlier_one_gives_that_row_again() -> None:
    """Iteration 3's arrival released iteration 1 (grace 2): replaying 3 must give 1's row back."""
    agg = Rig()
    for i in range(3):
        agg(it(i, T0 + 200 * i, T0 + 200 * i + 200))
    released = agg(it(3, T0 + 600, T0 + 800))
    assert [b.iteration for b in released] == [1]
    again = agg(it(3, T0 + 600, T0 + 800))
    assert released[0] in again and agg.join.duplicate_iterations == 1

