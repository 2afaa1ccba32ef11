"""`clocktower explain`: why an iteration was slow, in plain words, with the evidence behind each sentence.

Pure: it turns what explain_query.py read (the iteration's blame row, its ranks' breakdowns, the one-way delays of
the slowest rank's flows, the incidents open around it and the commands they caused) into sentences and a JSON
object. For example: "iteration 1234 of job-7 at 03:12:01.200 took 2.3x the job's typical 410 ms; rank 17 (on
node07, GPU 3) computed 780 ms against a median 402 ms, and the other ranks waited for it in their collectives
(up to 410 ms, rank 4); flow node07 -> node09 had a p99 one-way delay of 1.8 ms against a 12 us baseline; link_flap
on node07/eth2 from 03:11:58.000 to 03:12:10.000 (flapped 3 times); failover at 03:11:58.051 (applied)".
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

BLAME_WORDS = {
    "gpu": "a GPU fault on the slowest rank's GPU",
    "host": "the slowest rank computing slowly on a healthy GPU (its host: CPU, data loading, or the process)",
    "link": "a link fault on one of the job's nodes while the ranks communicated",
    "congestion": "congestion on the job's flows while the ranks communicated",
    "none": "no cause found",
}


BLAMED_KINDS = {"link": ("link_",), "congestion": ("congestion",), "gpu": ("gpu_",)}


@dataclass
class Iteration:
    """One row of iteration_blame."""

    job: str
    iteration: int
    start_ns: int
    duration_ns: int
    baseline_ns: int
    slowdown: float
    slowest_rank: int
    node: str
    gpu: int | None
    blame: str
    slowest_compute_ns: int
    median_compute_ns: int
    median_comm_ns: int
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass
class RankTime:
    rank: int
    node: str
    compute_ns: int
    comm_ns: int


@dataclass
class FlowDelay:
    src_node: str
    dst_node: str
    p99_ns: int
    baseline_ns: int | None
    samples: int


@dataclass
class IncidentSpan:
    incident_id: str
    kind: str
    node: str
    target: str
    severity: str
    opened_ns: int
    resolved_ns: int | None
    detail: str


@dataclass
class Command:
    incident_id: str
    action: str
    node: str
    target: str
    ts_ns: int
    status: str | None   # None: no ack


@dataclass
class Explanation:
    iteration: Iteration
    ranks: list[RankTime] = field(default_factory=list)
    flows: list[FlowDelay] = field(default_factory=list)
    incidents: list[IncidentSpan] = field(default_factory=list)
    commands: list[Command] = field(default_factory=list)


def clock(ns: int) -> str:
    """HH:MM:SS.mmm in UTC (the date is said once, in the heading)."""
    return datetime.fromtimestamp(ns / 1e9, UTC).strftime("%H:%M:%S.%f")[:-3]


def span(ns: int) -> str:
    """A duration the way an operator reads one: us under a millisecond, ms under ten seconds, else s."""
    if ns < 1_000_000:
        return f"{ns / 1e3:.0f} us" if ns >= 10_000 else f"{ns / 1e3:.1f} us"
    if ns < 10 * 10**9:
        return f"{ns / 1e6:.0f} ms" if ns >= 10**7 else f"{ns / 1e6:.1f} ms"
    return f"{ns / 1e9:.1f} s"


def narrate(e: Explanation) -> list[str]:
    """The sentences that explain `e`, most telling first; each names its figures."""
    it = e.iteration
    day = datetime.fromtimestamp(it.start_ns / 1e9, UTC).strftime("%Y-%m-%d")
    lines = [f"iteration {it.iteration} of {it.job} at {clock(it.start_ns)} UTC ({day}) took {span(it.duration_ns)}, "
             f"{it.slowdown:.1f}x the job's typical {span(it.baseline_ns)}"]
    where = f"on {it.node}" + (f", GPU {it.gpu}" if it.gpu is not None else "")
    waited = max((r for r in e.ranks if r.rank != it.slowest_rank), key=lambda r: r.comm_ns, default=None)
    sentence = (f"rank {it.slowest_rank} ({where}) computed {span(it.slowest_compute_ns)} against a median "
                f"{span(it.median_compute_ns)}")
    if waited is not None and waited.comm_ns > it.median_comm_ns:
        sentence += (f"; the other ranks waited for it in their collectives (rank {waited.rank} on {waited.node} "
                     f"{span(waited.comm_ns)}, median {span(it.median_comm_ns)})")
    lines.append(sentence)
    why = it.evidence.get("why")
    lines.append(f"blame: {it.blame}, {BLAME_WORDS.get(it.blame, it.blame)}" + (f" ({why})" if why else ""))
    for f in e.flows:
        base = f" against a {span(f.baseline_ns)} baseline" if f.baseline_ns else " (no baseline before it)"
        lines.append(f"flow {f.src_node} -> {f.dst_node} had a p99 one-way delay of {span(f.p99_ns)}{base} "
                     f"({f.samples} segments during the iteration)")
    shown, others = relevant(e)
    for i in shown:
        until = f"to {clock(i.resolved_ns)}" if i.resolved_ns else "still open"
        lines.append(f"{i.kind} on {i.target} ({i.severity}) from {clock(i.opened_ns)} {until}"
                     + (f": {i.detail}" if i.detail else ""))
    ids = {i.incident_id for i in shown}
    for c in e.commands:
        if c.incident_id in ids:
            lines.append(f"{c.action} of {c.target} on {c.node} at {clock(c.ts_ns)} ({c.status or 'no ack'})")
    if others:
        kinds = ", ".join(f"{k} x{n}" if n > 1 else k for k, n in sorted(Counter(i.kind for i in others).items()))
        lines.append(f"also open around it on the job's other nodes: {kinds}")
    if len(lines) == 3 and it.blame == "none":
        lines.append("no incident, congestion or command was found around it")
    return lines


def relevant(e: Explanation) -> tuple[list[IncidentSpan], list[IncidentSpan]]:
    """The incidents that bear on this iteration (on the slowest rank's node or its job, or of the blamed kind
    anywhere on the job's nodes), and the rest (only counted)."""
    it = e.iteration
    kinds = BLAMED_KINDS.get(it.blame, ())
    shown, others = [], []
    for i in e.incidents:
        mine = i.node == it.node or i.target.startswith((f"{it.node}/", f"{it.job}:")) or i.kind.startswith(kinds)
        (shown if mine else others).append(i)
    return shown, others


def as_json(e: Explanation) -> dict[str, Any]:
    """`e` with its sentences, for --json."""
    return {"narrative": narrate(e), **asdict(e)}
