"""Fail-slow ranks: the peer and changepoint judgement, and the straggler processor (incidents, thermal, replay)."""

from __future__ import annotations

import random

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from clocktower.schemas.analytics import Incident, IterationBreakdown
from clocktower.streams.detectors.rank_slowdown import RankTrack, SlowdownRule, judge
from clocktower.streams.detectors.straggler import MAX_PENDING, MAX_RANKS, StragglerDetector
from clocktower.streams.processor_runner import ProcessorRunner
from tests.test_detectors import Fed

T0 = 1_780_000_000 * 10**9
MS = 10**6
RULE = SlowdownRule()


def run_job(ranks: int, iterations: int, slow: dict[int, float], *, jitter: float = 0.02, seed: int = 0,
            slow_from: int = 0) -> list[tuple[int, int, str]]:
    """Judge a job's ranks over `iterations`; `slow` maps a rank to its compute factor from `slow_from` on.
    Returns (iteration, rank, "open"/"resolve") for every change."""
    rng = random.Random(seed)
    tracks = [RankTrack() for _ in range(ranks)]
    latest: dict[int, float] = {}
    out = []
    for i in range(iterations):
        for r in range(ranks):
            c = 200 * MS * (1 + rng.gauss(0, jitter)) * (slow.get(r, 1.0) if i >= slow_from else 1.0)
            latest[r] = c
            v = judge(tracks[r], c, list(latest.values()), RULE)
            if v and v.opened:
                out.append((i, r, "open"))
            if v and v.resolved:
                out.append((i, r, "resolve"))
    return out


def test_a_fresh_large_slowdown_is_found_in_its_first_iteration_and_a_small_one_within_sustain() -> None:
    assert run_job(32, 60, {9: 1.5}, slow_from=30) == [(30, 9, "open")]
    [(i, r, state)] = run_job(32, 60, {9: 1.15}, slow_from=30)
    assert (r, state) == (9, "open") and 30 <= i <= 30 + RULE.sustain - 1


def test_a_rank_slow_since_it_started_is_found_after_sustain_iterations() -> None:
    """No change to find in its own past: the peer comparison alone, held for `sustain` iterations."""
    [(i, r, state)] = run_job(16, 20, {3: 1.3})
    assert (r, state) == (3, "open") and i <= RULE.sustain + 1


def test_it_resolves_after_sustain_healthy_iterations() -> None:
    rng = random.Random(1)
    tracks = [RankTrack() for _ in range(8)]
    latest: dict[int, float] = {}
    states = []
    for i in range(40):
        for r in range(8):
            factor = 1.6 if r == 2 and 10 <= i < 20 else 1.0
            latest[r] = 100 * MS * factor * (1 + rng.gauss(0, 0.01))
            v = judge(tracks[r], latest[r], list(latest.values()), RULE)
            if v and (v.opened or v.resolved):
                states.append((i, "open" if v.opened else "resolve"))
    assert states == [(10, "open"), (20 + RULE.sustain - 1, "resolve")]


def test_too_few_ranks_are_not_judged() -> None:
    assert judge(RankTrack(), 500 * MS, [100 * MS, 500 * MS], RULE) is None


@settings(max_examples=25, deadline=None)
@given(ranks=st.integers(8, 64), jitter=st.floats(0.0, 0.02), seed=st.integers(0, 2**32 - 1))
def test_jitter_alone_never_makes_a_straggler(ranks: int, jitter: float, seed: int) -> None:
    assert run_job(ranks, 60, {}, jitter=jitter, seed=seed) == []


def bd(rank: int, it: int, compute_ms: float, *, node: str | None = None, gpu: int | None = None,
       job: str = "job-a", world_size: int | None = None) -> IterationBreakdown:
    """Rank r's breakdown: 8 ranks per node, GPU = r % 8."""
    node = node or f"node-{rank // 8}"
    start = T0 + it * 400 * MS
    compute = round(compute_ms * MS)
    return IterationBreakdown(node=node, ts_ns=start + compute + 50 * MS, job=job, rank=rank, iteration=it,
                              start_ns=start, end_ns=start + compute + 50 * MS, duration_ns=compute + 50 * MS,
                              comm_ns=50 * MS, compute_ns=compute, collectives=4, comm_bytes=1,
                              gpu=rank % 8 if gpu is None else gpu, world_size=world_size)


def feed(det: Fed, iterations: range, slow: dict[int, float], ranks: int = 16) -> list[Incident]:
    out = []
    for it in iterations:
        for r in range(ranks):
            out += det(bd(r, it, 200 * slow.get(r, 1.0) * (1 + 0.01 * ((r * 7 + it * 3) % 5 - 2))))
    return out


def test_the_incident_names_the_rank_node_and_gpu_with_its_evidence() -> None:
    det = Fed(StragglerDetector())
    assert feed(det, range(10), {}) == []
    [opened] = feed(det, range(10, 11), {11: 1.5})
    assert (opened.kind, opened.state, opened.target, opened.node) == ("straggler", "open", "job-a:rank11", "node-1")
    assert "rank 11 (node-1/gpu3)" in opened.detail and "1.50x" in opened.detail
    ev = orjson.loads(opened.evidence)
    assert (ev["rank"], ev["gpu"], ev["iteration"], ev["peers"]) == (11, 3, 10, 16) and ev["excess"] > 0.45
    assert feed(det, range(11, 15), {11: 1.5}) == []
    [done] = feed(det, range(15, 15 + RULE.sustain), {})
    assert (done.state, done.incident_id) == ("resolve", opened.incident_id)


def thermal(state: str, node: str = "node-1", gpu: int = 3, ts: int = T0, iid: str = "gpu_thermal:x") -> Incident:
    return Incident(node=node, ts_ns=ts, incident_id=iid, kind="gpu_thermal", state=state, severity="warning",
                    target=f"{node}/gpu{gpu}", opened_ns=T0)


def test_a_slow_rank_on_a_throttled_gpu_is_the_thermal_incident_not_a_straggler() -> None:
    det = Fed(StragglerDetector())
    feed(det, range(10), {})
    assert det(thermal("open")) == []
    [row] = feed(det, range(10, 12), {11: 1.3})             # +30 %: the CUSUM crosses in its second iteration
    assert (row.kind, row.state, row.incident_id, row.target) == ("gpu_thermal", "update", "gpu_thermal:x",
                                                                  "node-1/gpu3")
    assert "slowed the job" in row.detail and det.proc.counters()["folded_into_thermal"] == 1
    assert feed(det, range(12, 14), {11: 1.3}) == []
    resolved_at = bd(0, 14, 200).start_ns + 1
    assert det(thermal("resolve", ts=resolved_at)) == []
    assert feed(det, range(14, 15), {11: 1.3}) == []        # the iteration it began throttled: folded
    later = feed(det, range(15, 16), {11: 1.3})              # still slow once cool: a straggler of its own now
    assert [(i.kind, i.state) for i in later] == [("straggler", "open")]


def test_a_thermal_incident_read_whole_before_the_iterations_it_slowed_still_takes_them() -> None:
    """The streams may read a GPU's thermal open and resolve before the breakdowns of the iterations it slowed."""
    det = Fed(StragglerDetector())
    feed(det, range(10), {})
    assert det(thermal("open", ts=bd(0, 10, 200).start_ns)) == []
    assert det(thermal("resolve", ts=bd(0, 14, 200).start_ns)) == []
    rows = feed(det, range(10, 14), {11: 1.3})
    assert [(r.kind, r.state) for r in rows] == [("gpu_thermal", "update")] and "resolved since" in rows[0].detail


def test_a_thermal_incident_after_the_straggler_opened_links_the_two() -> None:
    det = Fed(StragglerDetector())
    feed(det, range(10), {})
    [opened] = feed(det, range(10, 11), {11: 1.5})
    [link] = det(thermal("open", ts=bd(0, 11, 200).ts_ns))
    assert (link.kind, link.state, link.incident_id) == ("straggler", "update", opened.incident_id)
    assert "gpu_thermal:x" in link.detail
    assert det(thermal("update", ts=bd(0, 12, 200).ts_ns)) == []   # an update of it: nothing more


def test_a_redelivered_breakdown_re_emits_what_it_emitted_and_changes_nothing() -> None:
    det = Fed(StragglerDetector())
    feed(det, range(10), {})
    [opened] = feed(det, range(10, 11), {11: 1.5})
    assert det(bd(15, 10, 200)) == [opened]                  # the breakdown that completed the iteration: its row
    assert det(bd(11, 10, 300)) == []                        # the slow rank's own made nothing (it waited for 15)
    assert det(bd(5, 3, 900)) == []                          # an old one: nothing, and it is not judged
    assert det.proc.counters()["redelivered"] == 3
    assert feed(det, range(11, 12), {11: 1.5}) == []         # still open, one incident


def test_jobs_are_judged_apart() -> None:
    det = Fed(StragglerDetector())
    for it in range(12):
        for r in range(8):
            assert det(bd(r, it, 200, job="fast")) == []
            det(bd(r, it, 300, job="slow"))                   # a slower job is not slow against the fast one
    assert det.proc.counters()["redelivered"] == 0


def test_a_rank_with_no_compute_time_is_judged_without_dividing_by_zero() -> None:
    """Collectives covering a whole iteration leave 0 ns of compute: a first reading of 0 is no baseline."""
    track = RankTrack()
    assert judge(track, 0.0, [0.0, 10.0, 10.0], RULE) is not None
    assert judge(track, 10.0, [10.0, 10.0, 10.0], RULE) is not None and track.baseline == 10.0


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_the_verdicts_do_not_depend_on_the_order_the_ranks_breakdowns_arrive(seed: int) -> None:
    """N workers publish the ranks' breakdowns interleaved in any order (within a few iterations of each other):
    with the job's world size known, every iteration is judged whole, so the rows are the same."""
    def rows(order: list[IterationBreakdown]) -> list[tuple]:
        det = Fed(StragglerDetector())
        out = [o for e in order for o in det(e)]
        return sorted((o.incident_id, o.state, o.ts_ns, o.detail, o.evidence) for o in out)

    events = [bd(r, it, 200 * (1.5 if r == 5 and 12 <= it < 20 else 1.0) * (1 + 0.01 * ((r * 7 + it * 3) % 5 - 2)),
                 world_size=16) for it in range(30) for r in range(16)]
    rng = random.Random(seed)
    shuffled = sorted(events, key=lambda e: e.iteration + rng.uniform(0, 1.5))   # ranks up to 1.5 iterations apart
    expected = rows(events)
    assert [s for _, s, *_ in expected] == ["open", "resolve"]
    assert rows(shuffled) == expected


def test_an_iteration_missing_a_dead_rank_is_judged_once_event_time_is_well_past_it() -> None:
    """Rank 15 dies after iteration 5: the job's later iterations never complete, and are judged with the 15 ranks
    they have once the partition's event time is MISSING_NS past them (not at once: a late rank is not a dead one)."""
    runner = ProcessorRunner(StragglerDetector())
    out: list = []
    for it in range(45):
        for r in range(16 if it <= 5 else 15):
            out += runner.run(0, [bd(r, it, 200 * (1.5 if r == 5 and it >= 8 else 1.0) * (1 + 0.01 * (r % 3 - 1)),
                                  world_size=16)])
        if it == 20:
            assert not [o for o in out if o.state == "open"]   # 12 iterations (4.8 s) on: still waiting for rank 15
    [opened] = [o for o in out if o.state == "open"]
    ev = orjson.loads(opened.evidence)
    assert opened.target == "job-a:rank5" and ev["iteration"] == 8 and ev["peers"] == 15


def test_a_world_size_that_never_fills_holds_at_most_max_pending_iterations() -> None:
    """A job claiming more ranks than report (a forged or stale world_size): its iterations are judged once
    MAX_PENDING wait, not held until MISSING_NS of event time (memory: each holds every rank's breakdown)."""
    runner = ProcessorRunner(StragglerDetector())
    def quick(r: int, it: int) -> IterationBreakdown:   # 70 iterations in 7 s: none is MISSING_NS old
        b = bd(r, 0, 50, world_size=MAX_RANKS * 10)
        shift = it * 100 * MS
        return b.model_copy(update={"iteration": it, "start_ns": b.start_ns + shift, "end_ns": b.end_ns + shift,
                                    "ts_ns": b.ts_ns + shift})

    for it in range(MAX_PENDING + 5):
        runner.run(0, [quick(r, it) for r in range(4)])
        assert len(runner.store.get('["job","job-a"]').pending) <= MAX_PENDING
    job = runner.store.get('["job","job-a"]')
    assert job.size == MAX_RANKS and job.done == 4
