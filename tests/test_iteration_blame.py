"""Blame per iteration: the verdict (gpu, host, link, congestion, none), and the processor giving one per iteration."""

from __future__ import annotations

import orjson

from clocktower.schemas.analytics import Incident, IterationBlame
from clocktower.streams.detectors.blame import BlameRule, JobBaseline, Open, RankTime, judge
from clocktower.streams.detectors.iteration_blame import LAG, IterationBlameProcessor
from tests.test_detectors import Fed
from tests.test_straggler import MS, T0, bd

RULE = BlameRule()


def ranks(compute_ms: list[float], comm_ms: float = 50.0) -> list[RankTime]:
    """Ranks that all end together: each waits for the slowest in its collectives."""
    end = max(compute_ms) + comm_ms
    return [RankTime(r, f"node-{r // 8}", r % 8, T0, round(end * MS), round(c * MS), round((end - c) * MS))
            for r, c in enumerate(compute_ms)]


def warm(base: JobBaseline) -> None:
    for _ in range(5):
        judge("j", ranks([200.0] * 16), base, Open(), RULE)


def test_an_iteration_at_its_baseline_is_blamed_on_nothing() -> None:
    base = JobBaseline()
    warm(base)
    v = judge("j", ranks([200.0] * 16), base, Open(), RULE)
    assert (v.blame, v.evidence["why"]) == ("none", "not slow") and abs(v.slowdown - 1) < 0.01


def test_a_slow_rank_on_a_faulty_gpu_is_the_gpu_and_on_a_healthy_one_the_host() -> None:
    base = JobBaseline()
    warm(base)
    slow = [200.0] * 16
    slow[11] = 300.0
    gpu_open = Open(gpu={"node-1/gpu3": ("gpu_thermal", "th-1")})
    v = judge("j", ranks(slow), base, gpu_open, RULE)
    assert (v.blame, v.slowest.rank, v.evidence["incident"]) == ("gpu", 11, "th-1")
    assert v.slowdown > 1.3 and v.baseline_ns == 250 * MS
    v = judge("j", ranks(slow), base, Open(straggler={"j:rank11": "st-1"}), RULE)
    assert (v.blame, v.evidence["incident"]) == ("host", "st-1")


def test_slow_communication_is_the_link_or_the_congestion_open_on_the_jobs_nodes() -> None:
    base = JobBaseline()
    warm(base)
    slow_comm = ranks([200.0] * 16, comm_ms=90.0)
    v = judge("j", slow_comm, base, Open(link={"node-1": [("link_flap", "lf-1", T0 + 2)]},
                                         congestion={"node-0": [("congestion", "c-1", T0 + 1)]}), RULE)
    assert (v.blame, v.evidence["incidents"]) == ("link", ["lf-1"])      # the newest cause
    v = judge("j", slow_comm, base, Open(link={"node-1": [("link_flap", "lf-1", T0)]},
                                         congestion={"node-0": [("congestion", "c-1", T0 + 1)]}), RULE)
    assert (v.blame, v.evidence["incidents"]) == ("congestion", ["c-1"])
    v = judge("j", slow_comm, base, Open(link={"node-9": [("link_down", "x", T0)]}), RULE)   # not the job's node
    assert v.blame == "none" and "no link or congestion" in v.evidence["why"]


def test_slow_iterations_do_not_move_the_baseline() -> None:
    base = JobBaseline()
    warm(base)
    before = base.duration_ns
    for _ in range(20):
        judge("j", ranks([200.0] * 15 + [400.0]), base, Open(), RULE)
    assert base.duration_ns == before


def feed(det: Fed, iterations: range, slow: dict[int, float], n: int = 16) -> list[IterationBlame]:
    out = []
    for it in iterations:
        for r in range(n):
            out += [e for e in det(bd(r, it, 200 * slow.get(r, 1.0))) if isinstance(e, IterationBlame)]
    return out


def test_one_row_per_iteration_once_its_ranks_are_in() -> None:
    det = Fed(IterationBlameProcessor())
    rows = feed(det, range(6), {})
    assert [r.iteration for r in rows] == list(range(6))   # the first waits LAG iterations: its rank count is new
    assert all(r.ranks == 16 and r.blame == "none" for r in rows)
    assert det(Incident(node="node-1", ts_ns=T0, incident_id="th-1", kind="gpu_thermal", state="open",
                        severity="warning", target="node-1/gpu3", opened_ns=T0)) == []
    [row] = feed(det, range(6, 7), {11: 1.5})
    assert (row.iteration, row.blame, row.slowest_rank, row.node, row.slowest_gpu) == (6, "gpu", 11, "node-1", 3)
    assert orjson.loads(row.evidence)["incident"] == "th-1"


def test_an_iteration_missing_a_rank_is_judged_lag_iterations_later_and_a_replay_re_emits_it() -> None:
    det = Fed(IterationBlameProcessor())
    feed(det, range(4), {})
    out = []
    for r in range(15):                          # rank 15 never reports iteration 4
        out += det(bd(r, 4, 200))
    assert out == []
    for it in range(5, 5 + LAG):
        for r in range(16):
            out += [e for e in det(bd(r, it, 200)) if isinstance(e, IterationBlame)]
    assert [r.iteration for r in out][0] == 4 and out[0].ranks == 15
    assert det(bd(3, 4, 200)) == [out[0]]        # a redelivered breakdown of a judged iteration: the same row
    assert det.proc.counters()["late_breakdowns"] == 1


def test_an_incident_resolved_before_its_iterations_are_judged_still_blames_them() -> None:
    """GPU health read ahead of the iterations: the thermal incident opened and resolved around iteration 6."""
    det = Fed(IterationBlameProcessor())
    feed(det, range(6), {})
    it6 = bd(0, 6, 200)
    det(gpu_incident("th-2", "gpu_thermal", ts=it6.start_ns - MS).model_copy(update={"opened_ns": it6.start_ns - MS}))
    det(gpu_incident("th-2", "gpu_thermal", "resolve", ts=it6.end_ns).model_copy(
        update={"opened_ns": it6.start_ns - MS}))
    [row] = feed(det, range(6, 7), {11: 1.5})
    assert (row.blame, orjson.loads(row.evidence)["incident"]) == ("gpu", "th-2")


def test_a_resolved_incident_no_longer_blames() -> None:
    det = Fed(IterationBlameProcessor())
    feed(det, range(6), {})
    inc = Incident(node="node-1", ts_ns=T0, incident_id="th-1", kind="gpu_thermal", state="open",
                   severity="warning", target="node-1/gpu3", opened_ns=T0)
    det(inc)
    det(inc.model_copy(update={"state": "resolve", "ts_ns": T0 + MS}))
    [row] = feed(det, range(6, 7), {11: 1.5})
    assert row.blame == "host"


def gpu_incident(iid: str, kind: str, state: str = "open", ts: int = T0) -> Incident:
    return Incident(node="node-1", ts_ns=ts, incident_id=iid, kind=kind, state=state, severity="warning",
                    target="node-1/gpu3", opened_ns=T0)


def test_two_incidents_on_one_gpu_blame_it_until_both_resolve() -> None:
    det = Fed(IterationBlameProcessor())
    feed(det, range(6), {})
    det(gpu_incident("th-1", "gpu_thermal"))
    det(gpu_incident("x-1", "gpu_xid", ts=T0 + 1))
    det(gpu_incident("x-1", "gpu_xid", "resolve", ts=T0 + 2))
    [row] = feed(det, range(6, 7), {11: 1.5})
    assert (row.blame, orjson.loads(row.evidence)["incident"]) == ("gpu", "th-1")


def test_the_breakdown_that_judged_an_earlier_iteration_re_emits_its_row_when_read_again() -> None:
    """State written, outputs lost: the record that made a row, read again, makes it again."""
    det = Fed(IterationBlameProcessor())
    assert det(bd(0, 0, 200)) == [] and det(bd(1, 0, 200)) == [] and det(bd(0, 1, 200)) == []
    [row] = det(bd(0, 2, 200))                  # iteration 0, judged LAG iterations later
    assert row.iteration == 0 and row.ranks == 2
    assert det(bd(0, 2, 200)) == [row]          # the same record again
    assert det(bd(0, 1, 200)) == []             # a pending one again: nothing, and no second copy kept
    assert det.proc.counters()["late_breakdowns"] == 2


def test_an_update_written_after_the_resolve_does_not_reopen_the_incident() -> None:
    """The straggler's fold row can come after the thermal resolve: the incident stays resolved for blame."""
    det = Fed(IterationBlameProcessor())
    feed(det, range(6), {})
    det(gpu_incident("th-3", "gpu_thermal", ts=T0))
    det(gpu_incident("th-3", "gpu_thermal", "resolve", ts=T0 + MS))
    det(gpu_incident("th-3", "gpu_thermal", "update", ts=T0 + 2 * MS))
    [row] = feed(det, range(6, 7), {11: 1.5})       # long after the resolve
    assert row.blame == "host"
