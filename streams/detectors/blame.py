"""Why was an iteration slow? One verdict per job iteration, from its ranks' breakdowns and the open incidents.

A synchronous iteration lasts as long as its slowest rank: the one that computed longest (the others wait for it
in their first collective). Its verdict:

- **none**: the iteration took under `slow_factor` times the job's baseline (an EWMA of its iterations that were
  not slow), or it was slow and nothing explains it (the evidence says so, with the figures);
- **gpu**: the slowest rank computed at least `compute_excess` over the ranks' median and its GPU has a fault
  incident open (thermal, XID, ECC, lost);
- **host**: ... and its GPU is healthy: the host (CPU, data loading, memory) or the process is slow (with the
  rank's straggler incident, if one is open);
- **link**: the ranks computed alike but communicated longer than the job's communication baseline, while a link
  incident (down, flap, quarantine) is open on one of the job's nodes;
- **congestion**: ... while a congestion incident is open on one of the job's nodes (when both are open, the one
  opened last is blamed: a congestion that began after a flap is the congestion).

Pure: `judge` takes the iteration's ranks and what is open, and returns the verdict and its evidence.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import median
from typing import Any

EWMA_ALPHA = 0.1
GPU_KINDS = ("gpu_thermal", "gpu_xid", "gpu_ecc", "gpu_lost")
LINK_KINDS = ("link_down", "link_flap", "link_quarantine")


@dataclass
class BlameRule:
    slow_factor: float = 1.10      # an iteration this much over the baseline is slow
    compute_excess: float = 0.10   # the slowest rank's compute this much over the median: a compute-side cause
    comm_excess: float = 0.20      # the median communication this much over its baseline: a network-side cause


@dataclass
class JobBaseline:
    duration_ns: float = 0.0
    comm_ns: float = 0.0
    iterations: int = 0


@dataclass
class RankTime:
    rank: int
    node: str
    gpu: int | None
    start_ns: int
    duration_ns: int
    compute_ns: int
    comm_ns: int


@dataclass
class Open:
    """The incidents open now: GPU incidents by "node/gpuN", link and congestion incidents by node."""

    gpu: dict[str, tuple[str, str]] = field(default_factory=dict)          # target -> (kind, id)
    link: dict[str, list[tuple]] = field(default_factory=dict)         # node -> [(kind, id, opened_ns)]
    congestion: dict[str, list[tuple]] = field(default_factory=dict)   # node -> [(kind, id, opened_ns)]
    straggler: dict[str, str] = field(default_factory=dict)                 # "job:rankN" -> id


@dataclass
class Verdict:
    blame: str
    slowest: RankTime
    duration_ns: int
    baseline_ns: int
    slowdown: float
    median_compute_ns: int
    median_comm_ns: int
    evidence: dict[str, Any]


def judge(job: str, ranks: list[RankTime], base: JobBaseline, open_: Open, rule: BlameRule) -> Verdict:
    """The verdict on one iteration; updates `base` with it when it was not slow."""
    slowest = max(ranks, key=lambda r: (r.compute_ns, -r.rank))
    duration = max(r.duration_ns for r in ranks)
    med_compute = int(median(r.compute_ns for r in ranks))
    med_comm = int(median(r.comm_ns for r in ranks))
    if base.iterations == 0:
        base.duration_ns, base.comm_ns = float(duration), float(med_comm)
    slowdown = duration / base.duration_ns if base.duration_ns > 0 else 1.0
    compute_excess = slowest.compute_ns / med_compute - 1 if med_compute > 0 else 0.0
    comm_excess = med_comm / base.comm_ns - 1 if base.comm_ns > 0 else 0.0
    evidence: dict[str, Any] = {"slowdown": round(slowdown, 3), "compute_excess": round(compute_excess, 3),
                                "comm_excess": round(comm_excess, 3), "slowest_rank": slowest.rank,
                                "slowest_node": slowest.node}
    blame = "none"
    if slowdown < rule.slow_factor:
        evidence["why"] = "not slow"
    elif compute_excess >= rule.compute_excess:
        gpu = open_.gpu.get(f"{slowest.node}/gpu{slowest.gpu}") if slowest.gpu is not None else None
        if gpu is not None:
            blame = "gpu"
            evidence.update(incident=gpu[1], incident_kind=gpu[0])
        else:
            blame = "host"
            evidence["why"] = "the slowest rank computes slowly on a GPU with no fault open"
            straggler = open_.straggler.get(f"{job}:rank{slowest.rank}")
            if straggler:
                evidence.update(incident=straggler, incident_kind="straggler")
    elif comm_excess >= rule.comm_excess:
        nodes = sorted({r.node for r in ranks})
        found = [("link", i) for n in nodes for i in open_.link.get(n, [])] + [
            ("congestion", i) for n in nodes for i in open_.congestion.get(n, [])]
        if found:   # the newest cause: a congestion that began after a flap is the congestion
            blame = max(found, key=lambda f: f[1][2] if len(f[1]) > 2 else 0)[0]
            evidence["incidents"] = [i[1] for b, i in found if b == blame]
        else:
            evidence["why"] = "communication is slow and no link or congestion incident is open"
    else:
        evidence["why"] = "slow, with neither compute nor communication out of line"
    baseline = round(base.duration_ns)
    if slowdown < rule.slow_factor:
        base.duration_ns += EWMA_ALPHA * (duration - base.duration_ns)
        base.comm_ns += EWMA_ALPHA * (med_comm - base.comm_ns)
    base.iterations += 1
    return Verdict(blame, slowest, duration, baseline, slowdown, med_compute, med_comm, evidence)
