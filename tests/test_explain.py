"""`clocktower explain`'s narrative from the evidence (the end-to-end run is in tests/test_demo.py)."""

from __future__ import annotations

import pytest

from clocktower.explain import Command, Explanation, FlowDelay, IncidentSpan, Iteration, RankTime, narrate, span
from clocktower.explain_query import parse_since
from clocktower.runtime.errors import UserError

T = 1_796_649_121_200_000_000   # 2026-12-07 ... UTC
MS = 10**6


def _iteration(blame: str = "link", **kw) -> Iteration:  # noqa: ANN003
    fields = dict(job="job-7", iteration=1234, start_ns=T, duration_ns=943 * MS, baseline_ns=410 * MS, slowdown=2.3,
                  slowest_rank=17, node="node07", gpu=3, blame=blame, slowest_compute_ns=402 * MS,
                  median_compute_ns=400 * MS, median_comm_ns=12 * MS, evidence={"why": "communication slow"})
    return Iteration(**{**fields, **kw})


def _flap(node: str = "node07", kind: str = "link_flap") -> IncidentSpan:
    return IncidentSpan("inc-1", kind, node, f"{node}/eth2", "critical", T - 3 * 10**9, T + 9 * 10**9,
                        "flapped 3 times")


def test_a_link_blamed_iteration_names_the_wait_the_flow_the_flap_and_its_commands() -> None:
    ranks = [RankTime(17, "node07", 402 * MS, 20 * MS), RankTime(4, "node02", 401 * MS, 410 * MS)]
    e = Explanation(_iteration(), ranks,
                    [FlowDelay("node07", "node09", 1_800_000, 12_000, 40)], [_flap()],
                    [Command("inc-1", "failover", "node07", "eth2", T - 3 * 10**9 + 51 * MS, "applied"),
                     Command("other", "drain", "node01", "node01", T, "applied")])
    lines = narrate(e)
    assert lines[0].startswith("iteration 1234 of job-7 at ") and "2.3x the job's typical 410 ms" in lines[0]
    assert "rank 17 (on node07, GPU 3)" in lines[1] and "rank 4 on node02 410 ms" in lines[1]
    assert lines[2].startswith("blame: link, a link fault")
    assert "flow node07 -> node09 had a p99 one-way delay of 1.8 ms against a 12 us baseline" in lines[3]
    assert lines[4].startswith("link_flap on node07/eth2 (critical) from ") and "flapped 3 times" in lines[4]
    assert lines[5].startswith("failover of eth2 on node07 at ") and lines[5].endswith("(applied)")
    assert not any("drain" in line for line in lines)        # a command of an incident not shown is not shown


def test_incidents_elsewhere_are_only_counted_unless_they_are_of_the_blamed_kind() -> None:
    elsewhere = [_flap("node09"), IncidentSpan("x", "gpu_xid", "node03", "node03/gpu5", "critical", T, None, "")]
    lines = narrate(Explanation(_iteration(blame="host"), incidents=elsewhere))
    assert lines[-1] == "also open around it on the job's other nodes: gpu_xid, link_flap"
    lines = narrate(Explanation(_iteration(blame="link"), incidents=elsewhere))
    assert any(line.startswith("link_flap on node09/eth2") for line in lines)
    assert "gpu_xid" in lines[-1]


def test_an_iteration_with_no_cause_says_so() -> None:
    lines = narrate(Explanation(_iteration(blame="none", evidence={})))
    assert lines[2] == "blame: none, no cause found" and lines[-1] == "no incident, congestion or command was found " \
                                                                       "around it"


def test_durations_read_the_way_an_operator_reads_them() -> None:
    assert [span(n) for n in (5_800, 12_000, 1_800_000, 410 * MS, 12 * 10**9)] == [
        "5.8 us", "12 us", "1.8 ms", "410 ms", "12.0 s"]


def test_since_takes_a_duration_ago_or_an_iso_time() -> None:
    now = 10**18
    assert parse_since("15m", now) == now - 15 * 60 * 10**9 and parse_since("1.5h", now) == now - 5400 * 10**9
    assert parse_since("2026-12-07T03:12:00") == parse_since("2026-12-07T03:12:00+00:00") == 1796613120 * 10**9
    with pytest.raises(UserError, match="neither a duration ago"):
        parse_since("yesterday")
