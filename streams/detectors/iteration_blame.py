"""Blame per iteration: for every job iteration, the slowest rank and why it was slow (blame.py), as an
`IterationBlame` row on analytics.blame.

Reads the ranks' breakdowns (analytics.iterations) and the incidents (analytics.incidents), both of one partition,
so one worker sees every job and every incident (key "fleet"). An iteration is judged once as many ranks reported
it as the job has (`world_size`, from its producers) or had in its last judged iteration, or, for one whose ranks
stay missing (the first of a job of unknown size, or a rank that died), once a rank of the job reported `LAG`
iterations later. It is blamed on the incidents open at some time
during it (by their open and resolve times, on the nodes' clocks: the streams read GPU health and the iterations at
different paces, and an incident's resolve may come before the iterations it overlapped); an incident read only
after the iteration was judged is not seen.

State: one entry per job (its baseline, the iterations waiting for ranks, the newest judged, and its newest
`RECENT` rows, each with the breakdown that made it, re-emitted when that breakdown comes again), and one fleet-wide
entry of open incidents (at most `MAX_OPEN`, past that a new one is not kept, counted in `open_dropped`; one open
for `OPEN_MAX_AGE_NS` is forgotten, as its resolve may never come).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any, ClassVar

import orjson

from clocktower.schemas.analytics import Incident, IterationBlame, IterationBreakdown
from clocktower.schemas.event import Event
from clocktower.streams.detectors.blame import (
    GPU_KINDS,
    LINK_KINDS,
    BlameRule,
    JobBaseline,
    Open,
    RankTime,
    judge,
)
from clocktower.streams.detectors.straggler import MAX_RANKS
from clocktower.streams.processor import Output, Processor, compound_key

if TYPE_CHECKING:
    from clocktower.streams.processor_context import ProcessorContext

LAG = 2
RECENT = 8
MAX_OPEN = 10_000
OPEN = "open"
DEFAULT_TTL_NS = 3600 * 10**9
OPEN_TTL_NS = 365 * 24 * 3600 * 10**9
OPEN_MAX_AGE_NS = 24 * 3600 * 10**9   # an incident open this long without a resolve is forgotten
RESOLVED_KEEP_NS = 600 * 10**9        # a resolved incident is kept this long, for iterations judged late


class IterationBlameProcessor(Processor):
    name: ClassVar[str] = "iteration_blame"
    consumes: ClassVar[tuple[type[Event], ...]] = (IterationBreakdown, Incident)
    key_by: ClassVar[str] = "fleet (analytics.iterations and analytics.incidents have one partition)"

    def __init__(self, rule: BlameRule | None = None, ttl_ns: int = DEFAULT_TTL_NS) -> None:
        self.rule = rule or BlameRule()
        self.state_ttl_ns = ttl_ns
        self.late = 0            # breakdowns of an iteration already judged
        self.open_dropped = 0

    @classmethod
    def from_context(cls, ctx: ProcessorContext) -> IterationBlameProcessor:
        return cls()

    def partition_key(self, event: Event) -> str:
        return "fleet"

    def counters(self) -> dict[str, int]:
        return {"late_breakdowns": self.late, "open_dropped": self.open_dropped}

    def process(self, state: Any, event: Event) -> list[Output]:
        if isinstance(event, Incident):
            self._track(state, event)
            return []
        assert isinstance(event, IterationBreakdown)
        key = compound_key("job", event.job)
        job = state.get(key) or {"base": asdict(JobBaseline()), "pending": {}, "done": -1, "ranks": 0,
                                 "recent": []}
        by = [event.rank, event.iteration]
        made = [IterationBlame.model_construct(**r["row"]) for r in job["recent"] if r.get("by") == by]
        seen = job["pending"].get(str(event.iteration), {}).get(str(event.rank)) is not None
        if made or seen or event.iteration <= job["done"]:   # a redelivery: what it made comes again
            self.late += 1
            return list(made) or [IterationBlame.model_construct(**r["row"]) for r in job["recent"]
                                  if r["row"]["iteration"] == event.iteration]
        job["pending"].setdefault(str(event.iteration), {})[str(event.rank)] = [
            event.node, event.gpu, event.start_ns, event.duration_ns, event.compute_ns, event.comm_ns]
        job["ranks"] = max(job["ranks"], min(event.world_size or 0, MAX_RANKS))   # as its producers say, bounded
        out = []
        for it in sorted(int(i) for i in job["pending"]):
            ranks = job["pending"][str(it)]
            complete = job["ranks"] > 0 and len(ranks) >= job["ranks"]
            if not (complete or event.iteration >= it + LAG):
                break
            out.append(self._judge(state, event.job, it, ranks, job))
            del job["pending"][str(it)]
            job["done"] = it
            job["ranks"] = max(job["ranks"], len(ranks))
        job["recent"] = (job["recent"] + [{"row": r.model_dump(), "by": by} for r in out])[-RECENT:]
        state.put(key, job, event.ts_ns + self.state_ttl_ns)
        return list(out)

    def _judge(self, state: Any, job_name: str, iteration: int, ranks: dict, job: dict) -> IterationBlame:
        times = [RankTime(int(r), node, gpu, start, duration, compute, comm)
                 for r, (node, gpu, start, duration, compute, comm) in ranks.items()]
        base = JobBaseline(**job["base"])
        v = judge(job_name, times, base, self._open(state, min(t.start_ns for t in times),
                                                     max(t.start_ns + t.duration_ns for t in times)), self.rule)
        job["base"] = asdict(base)
        s = v.slowest
        return IterationBlame(
            node=s.node, ts_ns=max(t.start_ns + t.duration_ns for t in times), job=job_name, iteration=iteration,
            start_ns=min(t.start_ns for t in times), duration_ns=v.duration_ns, baseline_ns=v.baseline_ns,
            slowdown=round(v.slowdown, 4), ranks=len(times), slowest_rank=s.rank, slowest_gpu=s.gpu,
            slowest_compute_ns=s.compute_ns, median_compute_ns=v.median_compute_ns, median_comm_ns=v.median_comm_ns,
            blame=v.blame, evidence=orjson.dumps(v.evidence).decode())

    @staticmethod
    def _open(state: Any, start_ns: int, end_ns: int) -> Open:
        """The incidents open at some time of the iteration [start_ns, end_ns]: those still open, and those resolved
        after it began (the streams may read an incident's resolve before the iterations it overlapped)."""
        d = state.get(OPEN) or {}

        def during(opened: int, resolved: int) -> bool:
            return opened <= end_ns and (not resolved or resolved >= start_ns)

        gpu: dict[str, tuple[str, str]] = {}
        for kind, incident_id, target, opened, resolved in d.get("gpu", []):
            if during(opened, resolved):
                gpu.setdefault(target, (kind, incident_id))   # the oldest one on the GPU
        link, congestion = (
            {n: [(k, i, o) for k, i, o, r in v if during(o, r)] for n, v in d.get(group, {}).items()}
            for group in ("link", "congestion"))
        straggler = {t: i for t, (i, o, r) in d.get("straggler", {}).items() if during(o, r)}
        return Open(gpu=gpu, link={n: v for n, v in link.items() if v},
                    congestion={n: v for n, v in congestion.items() if v}, straggler=straggler)

    def _track(self, state: Any, inc: Incident) -> None:
        """Keep the GPU, link, congestion and straggler incidents with when they opened and resolved (0: open), an
        incident that changed kind (link_down -> link_flap) once. A resolved one is kept RESOLVED_KEEP_NS, one whose
        resolve never came (its detector's entry expired) OPEN_MAX_AGE_NS."""
        d = state.get(OPEN) or {}
        now = inc.ts_ns
        resolved = now if inc.state == "resolve" else 0
        if inc.state == "update":   # an update (a fold written after the resolve) keeps what is known of its resolve
            known = [g[4] for g in d.get("gpu", []) if g[1] == inc.incident_id] + [
                x[3] for group in ("link", "congestion") for v in d.get(group, {}).values() for x in v
                if x[1] == inc.incident_id] + [v[2] for v in d.get("straggler", {}).values() if v[0] == inc.incident_id]
            resolved = max(known, default=0)

        def keep(opened: int, was_resolved: int) -> bool:
            return (now - was_resolved <= RESOLVED_KEEP_NS) if was_resolved else now - opened <= OPEN_MAX_AGE_NS

        gpu = [g for g in d.get("gpu", []) if g[1] != inc.incident_id and keep(g[3], g[4])]
        link, congestion = (
            {n: kept for n, v in d.get(group, {}).items()
             if (kept := [x for x in v if x[1] != inc.incident_id and keep(x[2], x[3])])}
            for group in ("link", "congestion"))
        straggler = {t: v for t, v in d.get("straggler", {}).items() if v[0] != inc.incident_id and keep(v[1], v[2])}
        size = len(gpu) + len(straggler) + sum(map(len, link.values())) + sum(map(len, congestion.values()))
        if size >= MAX_OPEN:
            self.open_dropped += 1
        elif inc.kind in GPU_KINDS:
            gpu.append([inc.kind, inc.incident_id, inc.target, inc.opened_ns, resolved])
        elif inc.kind in LINK_KINDS:
            link.setdefault(inc.node, []).append([inc.kind, inc.incident_id, inc.opened_ns, resolved])
        elif inc.kind == "congestion":
            congestion.setdefault(inc.node, []).append([inc.kind, inc.incident_id, inc.opened_ns, resolved])
        elif inc.kind == "straggler":
            straggler[inc.target] = [inc.incident_id, inc.opened_ns, resolved]
        state.put(OPEN, {"gpu": gpu, "link": link, "congestion": congestion, "straggler": straggler},
                  inc.ts_ns + OPEN_TTL_NS)

    def encode_state(self, value: Any) -> bytes:
        return orjson.dumps(value)

    def decode_state(self, data: bytes) -> Any:
        return orjson.loads(data)
