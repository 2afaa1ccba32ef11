"""Fail-slow ranks: a `straggler` incident for a rank that computes slower than its job's other ranks.

Reads the per-rank iteration breakdowns (analytics.iterations) and judges each rank's compute time against its
peers and its own past (rank_slowdown.py). An iteration is judged once every rank reported it (`world_size`, from
the producers; else as many ranks as the job's largest iteration had), its ranks in rank order against that
iteration's compute times, so the verdicts do not depend on the order in which the ranks' breakdowns arrive (N
workers, one worker, a replay). One whose ranks stay missing (a rank died) is judged with the ranks it has once the
partition's event time is `MISSING_NS` past its end (that time waits for the slowest node, so a rank whose records
come late through a worker that restarted is not taken for a dead one), or, for a job of unknown size, once a rank
of the job reported `LAG` iterations later: that one depends on arrival order. Both are checked when a breakdown of
the job comes (a job that stopped leaves its last incomplete iteration unjudged); past `MAX_PENDING` iterations
waiting, the oldest is judged as it is, and a `world_size` is believed up to `MAX_RANKS`. The incident names the
rank (target "job:rankN"), its node and its
GPU, opens after the slowdown is sustained or a change is found, carries the figures as evidence, and resolves
when the rank recovers.

A slow rank whose GPU is thermally throttled is one fault, not two: this processor also reads the incidents
(analytics.incidents), keeps which GPUs have a `gpu_thermal` incident open, and instead of opening a straggler
incident for such a rank writes an `update` row of the thermal incident that says the rank is slowing its job
(also for an iteration judged after the incident resolved but begun before: it ran throttled, and the streams may
read GPU health ahead of the iterations; the row then says the incident has resolved since).
If the straggler incident opened first (the two topics race), the thermal incident's arrival adds an update to
the straggler incident naming the thermal one, so the two are linked.

Keyed by "fleet": analytics.iterations and analytics.incidents have one partition each, so one worker sees every
job and every GPU incident. One state entry per job (its ranks' tracks and the iterations waiting for ranks), one
per GPU with an open thermal incident, and one per GPU whose rank has a straggler incident open. A redelivered breakdown
(one already waiting, or of an iteration judged) changes nothing and re-emits what it made when it completed its
iteration, from the newest `RECENT` emissions kept per job. A job's entry holds every rank and the iterations
waiting for ranks, so it grows with the job: about 300 bytes a rank, written after each batch that touches the job
(a 1,000-rank job: 300 KB). The thermal fold still depends on whether the thermal incident was read before the
iteration was judged (two topics: their relative order is the arrival order); judging at completion makes that
likely, as the GPU's early warning comes seconds before its throttling slows the rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

import orjson

from clocktower.schemas.analytics import Incident, IterationBreakdown
from clocktower.schemas.event import Event
from clocktower.schemas.ids import bounded_name, stable_id
from clocktower.streams.detectors.rank_slowdown import RankTrack, SlowdownRule, Verdict, judge
from clocktower.streams.processor import Output, Processor, compound_key

if TYPE_CHECKING:
    from clocktower.streams.processor_context import ProcessorContext

RECENT = 16                          # emissions kept per job, for a replay after a crash
LAG = 2                              # a job of unknown size: an iteration is judged once a rank is this many ahead
MISSING_NS = 10 * 10**9              # a job of known size: an iteration missing ranks is judged this long after it
MAX_RANKS = 1_000_000                # a world_size past this is not believed (a job waits on it: memory, delay)
MAX_PENDING = 64                     # iterations waiting for ranks: past this, the oldest is judged as it is
THERMAL_GRACE_NS = 5 * 10**9         # how long a resolved thermal incident is kept: an iteration that began before
                                     # it resolved was throttled in part, and is no straggler of its own
DEFAULT_TTL_NS = 3600 * 10**9       # a job idle this long (event time) is forgotten


@dataclass
class Rank:
    track: RankTrack = field(default_factory=RankTrack)
    iteration: int = -1              # (unused: entries written before iterations were judged whole have it)
    node: str = ""
    gpu: int | None = None
    incident: str = ""               # open straggler incident ("" = none)
    opened_ns: int = 0
    thermal: str = ""                # the thermal incident it was folded into ("" = none)


@dataclass
class Job:
    ranks: dict[str, Rank] = field(default_factory=dict)          # str(rank) -> its state
    recent: list[list[Any]] = field(default_factory=list)         # [rank, iteration, [incident dicts]] (what made them)
    pending: dict[str, dict[str, list[Any]]] = field(default_factory=dict)   # iteration -> rank -> RankIteration
    done: int = -1                   # newest iteration judged
    size: int = 0                    # ranks an iteration needs to be complete (0: not known yet)


class RankIteration(NamedTuple):
    """What is judged of one rank's iteration (the fields of IterationBreakdown the verdict and its rows read)."""

    job: str
    rank: int
    iteration: int
    node: str
    gpu: int | None
    start_ns: int
    ts_ns: int
    compute_ns: int


def gpu_target(node: str, gpu: int | None) -> str:
    """The target the GPU detector gives a GPU's incidents."""
    return bounded_name(f"{node}/gpu{gpu}")


class StragglerDetector(Processor):
    name: ClassVar[str] = "straggler"
    consumes: ClassVar[tuple[type[Event], ...]] = (IterationBreakdown, Incident)
    key_by: ClassVar[str] = "fleet (analytics.iterations and analytics.incidents have one partition)"

    def __init__(self, rule: SlowdownRule | None = None, ttl_ns: int = DEFAULT_TTL_NS) -> None:
        self.rule = rule or SlowdownRule()
        self.state_ttl_ns = ttl_ns
        self.redelivered = 0
        self.folded = 0          # slow ranks reported as their GPU's thermal fault

    @classmethod
    def from_context(cls, ctx: ProcessorContext) -> StragglerDetector:
        return cls()

    def partition_key(self, event: Event) -> str:
        return "fleet"

    def counters(self) -> dict[str, int]:
        return {"redelivered": self.redelivered, "folded_into_thermal": self.folded}

    def process(self, state: Any, event: Event) -> list[Output]:
        if isinstance(event, Incident):
            return self._incident(state, event)
        assert isinstance(event, IterationBreakdown)
        key = compound_key("job", event.job)
        job: Job = state.get(key) or Job()
        waiting = job.pending.get(str(event.iteration), {})
        if event.iteration <= job.done or str(event.rank) in waiting:   # a redelivery: what it made comes again
            self.redelivered += 1
            return [Incident.model_construct(**d) for rk, it, ds in job.recent
                    if rk == event.rank and it == event.iteration for d in ds]
        job.pending.setdefault(str(event.iteration), {})[str(event.rank)] = list(RankIteration(
            event.job, event.rank, event.iteration, event.node, event.gpu, event.start_ns, event.ts_ns,
            event.compute_ns))
        job.size = max(job.size, min(event.world_size or 0, MAX_RANKS))
        out: list[Incident] = []
        for it in sorted(int(i) for i in job.pending):
            ranks = job.pending[str(it)]
            complete = job.size and len(ranks) >= job.size
            if event.world_size:
                overdue = state.now_ns >= max(r[6] for r in ranks.values()) + MISSING_NS   # r[6]: its ts_ns
            else:
                overdue = event.iteration >= it + LAG
            overdue = overdue or len(job.pending) > MAX_PENDING   # a size that never fills (bounded state)
            if not (complete or overdue):
                break
            del job.pending[str(it)]
            out += self._judge_iteration(state, job, [RankIteration(*ranks[r]) for r in sorted(ranks, key=int)])
            job.done = it
            job.size = max(job.size, len(ranks))
        if out:
            job.recent = [*job.recent, [event.rank, event.iteration, [o.model_dump() for o in out]]][-RECENT:]
        state.put(key, job, event.ts_ns + self.state_ttl_ns)
        return out

    def _judge_iteration(self, state: Any, job: Job, ranks: list[RankIteration]) -> list[Incident]:
        """Every rank of one iteration, in rank order, against that iteration's compute times."""
        peers = [float(r.compute_ns) for r in ranks]
        out: list[Incident] = []
        for ev in ranks:
            rank = job.ranks.get(str(ev.rank)) or Rank()
            rank.node, rank.gpu = ev.node, ev.gpu
            job.ranks[str(ev.rank)] = rank
            verdict = judge(rank.track, float(ev.compute_ns), peers, self.rule)
            if verdict:
                out += self._outputs(state, ev, rank, verdict)
        return out

    def _outputs(self, state: Any, ev: RankIteration, rank: Rank, v: Verdict) -> list[Incident]:
        evidence = orjson.dumps({
            "rank": ev.rank, "node": ev.node, "gpu": ev.gpu, "iteration": ev.iteration,
            "compute_ms": ev.compute_ns / 1e6, "peer_median_ms": v.peer_median / 1e6, "peer_mad_ms": v.peer_mad / 1e6,
            "excess": round(v.excess, 4), "z": round(v.z, 2), "cusum": round(v.cusum, 3), "peers": v.peers,
            "baseline_ms": rank.track.baseline / 1e6}).decode()
        where = f"rank {ev.rank} ({ev.node}/gpu{ev.gpu})" if ev.gpu is not None else f"rank {ev.rank} ({ev.node})"
        how = f"computes {1 + v.excess:.2f}x the median of its job's {v.peers} ranks"
        thermal = self._thermal_of(state, ev)
        # a rank folded into its GPU's thermal incident that is still slow once that resolves: a straggler now
        if v.opened or (v.slow and rank.track.straggling and rank.thermal and thermal is None and not rank.incident):
            if thermal is not None:
                self.folded += 1
                if rank.thermal == thermal[0]:
                    return []   # said once per rank and thermal incident
                rank.thermal = thermal[0]
                since = " (it has resolved since)" if thermal[2] else ""
                return [Incident(node=ev.node, ts_ns=ev.ts_ns, incident_id=thermal[0], kind="gpu_thermal",
                                 state="update", severity="critical", target=gpu_target(ev.node, ev.gpu),
                                 opened_ns=thermal[1], detail=f"{where} of {ev.job} {how} while throttled: this "
                                 f"thermal fault slowed the job (one fault, not a separate straggler){since}",
                                 evidence=evidence)]
            rank.incident = stable_id("straggler", ev.job, ev.rank, ev.ts_ns)
            rank.opened_ns, rank.thermal = ev.ts_ns, ""
            if ev.gpu is not None:
                state.put(compound_key("straggling", gpu_target(ev.node, ev.gpu)),
                          (ev.job, ev.rank, rank.incident, rank.opened_ns), ev.ts_ns + self.state_ttl_ns)
            return [self._row(ev, rank, "open", "warning", f"{where} {how} (iteration {ev.iteration})", evidence)]
        if v.resolved:
            out = []
            if rank.incident:
                out.append(self._row(ev, rank, "resolve", "info", f"{where} recovered: {how}", evidence))
                if ev.gpu is not None:
                    state.delete(compound_key("straggling", gpu_target(ev.node, ev.gpu)))
            rank.incident, rank.opened_ns, rank.thermal = "", 0, ""
            return out
        return []

    @staticmethod
    def _thermal_of(state: Any, ev: RankIteration) -> tuple[str, int, int] | None:
        """The thermal incident of the rank's GPU, open, or resolved after this iteration began (it ran throttled
        in part): (id, opened_ns, resolved_ns or 0), or None. Both times are on the rank's node's clock."""
        found = state.get(compound_key("thermal", gpu_target(ev.node, ev.gpu))) if ev.gpu is not None else None
        if found is None or (found[2] and ev.start_ns > found[2]):
            return None
        return found

    @staticmethod
    def _row(ev: RankIteration, rank: Rank, state: str, severity: str, detail: str, evidence: str) -> Incident:
        return Incident(node=ev.node, ts_ns=ev.ts_ns, incident_id=rank.incident, kind="straggler", state=state,
                        severity=severity, target=bounded_name(f"{ev.job}:rank{ev.rank}"), opened_ns=rank.opened_ns,
                        detail=detail, evidence=evidence)

    def _incident(self, state: Any, inc: Incident) -> list[Output]:
        """Keep which GPUs have a thermal incident open; link a straggler incident already open on one."""
        if inc.kind != "gpu_thermal":
            return []
        key = compound_key("thermal", inc.target)
        if inc.state == "resolve":
            state.put(key, (inc.incident_id, inc.opened_ns, inc.ts_ns), inc.ts_ns + THERMAL_GRACE_NS)
            return []
        known = state.get(key)
        if known is not None and known[2] and known[0] == inc.incident_id:
            return []   # a late update of an incident already resolved
        state.put(key, (inc.incident_id, inc.opened_ns, 0), inc.ts_ns + self.state_ttl_ns)
        if known is not None and not known[2]:
            return []
        return self._link(state, inc) if inc.state == "open" else []

    def _link(self, state: Any, inc: Incident) -> list[Output]:
        """A thermal incident opened on a GPU whose rank already has a straggler incident open: say they are one."""
        straggling = state.get(compound_key("straggling", inc.target))
        if straggling is None:
            return []
        job, rank, incident_id, opened_ns = straggling
        node = inc.target.rsplit("/", 1)[0]
        return [Incident(node=node, ts_ns=inc.ts_ns, incident_id=incident_id, kind="straggler", state="update",
                         severity="warning", target=bounded_name(f"{job}:rank{rank}"), opened_ns=opened_ns,
                         detail=f"its GPU is thermally throttled ({inc.incident_id}): one fault",
                         evidence=orjson.dumps({"thermal_incident": inc.incident_id}).decode())]

    def encode_state(self, value: Any) -> bytes:
        if isinstance(value, Job):
            return orjson.dumps(value)   # orjson writes the dataclasses itself: asdict's bytes, at a tenth of its cost
        return orjson.dumps(list(value))

    def decode_state(self, data: bytes) -> Any:
        d = orjson.loads(data)
        if isinstance(d, list):
            return tuple(d)
        ranks = {r: Rank(**{**x, "track": RankTrack(**x["track"])}) for r, x in d["ranks"].items()}
        return Job(ranks, d["recent"], d.get("pending", {}), d.get("done", -1), d.get("size", 0))
