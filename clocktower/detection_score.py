"""Score detectors against the simulator's ground truth: precision, recall and detection latency per fault kind.

An incident is known by its id; its first row (open, or the first update of an incident that changed kind) dates
it, on the true time of the node that reported it. It detects an injected fault when its kind is one that fault
kind is accepted as (`ACCEPTS`), it is about the fault's target (the same GPU, port, rank or link), and it is
dated from `EARLY_NS` before the fault's start to `LATE_NS` after its end. Precision counts, per kind, the
incidents that detect some fault; recall, the faults some incident detects; latency runs from the fault's start
to its first detecting incident. An incident of a kind no fault kind accepts, or one that detects no fault, is a
false positive of the kind it maps to (`INCIDENT_KIND`); on a fault-free run every incident is one.

An update row that folds another signal into an incident (a straggler into its GPU's thermal incident) keeps
the incident's id, so one fault stays one incident here as well.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from statistics import median

from clocktower.schemas.analytics import Incident
from clocktower.schemas.operations import InjectedFault

ACCEPTS: dict[str, tuple[str, ...]] = {
    "link_flap": ("link_flap", "link_down", "link_quarantine"),
    "link_blip": ("link_blip",),
    "congestion": ("congestion",),
    "gpu_thermal": ("gpu_thermal",),
    "gpu_xid": ("gpu_xid", "gpu_lost"),
    "gpu_ecc": ("gpu_ecc",),
    "straggler": ("straggler",),
    "node_silent": ("node_silent",),
}
INCIDENT_KIND: dict[str, str] = {k: fault for fault, kinds in ACCEPTS.items() for k in kinds}
EARLY_NS = 500_000_000        # an incident up to this much before the fault's start (clock error, a fast warning)
LATE_NS = 5_000_000_000       # ... and up to this much after its end (a straggler's iteration ends after it)


@dataclass
class KindScore:
    faults: int = 0
    detected: int = 0
    incidents: int = 0
    true_incidents: int = 0
    latencies_ms: list[float] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"faults": self.faults, "detected": self.detected, "incidents": self.incidents,
                "precision": _ratio(self.true_incidents, self.incidents),
                "recall": _ratio(self.detected, self.faults),
                "latency_ms_p50": _quantile(self.latencies_ms, 0.5),
                "latency_ms_p95": _quantile(self.latencies_ms, 0.95)}


def _ratio(a: int, b: int) -> float | None:
    return round(a / b, 4) if b else None


def _quantile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return round(s[min(len(s) - 1, int(q * len(s)))], 1) if q != 0.5 else round(median(s), 1)


def first_rows(incidents: Iterable[Incident]) -> list[Incident]:
    """Each incident's first open or update row (its earliest by ts_ns), one per incident id."""
    first: dict[str, Incident] = {}
    for inc in incidents:
        if inc.state == "resolve":
            continue
        seen = first.get(inc.incident_id)
        if seen is None or inc.ts_ns < seen.ts_ns:
            first[inc.incident_id] = inc
    return list(first.values())


def same_target(fault: InjectedFault, inc: Incident) -> bool:
    """Whether the incident is about the fault's target: "node:gpu3" is "node/gpu3", "node:eth0" "node/eth0"."""
    if fault.kind == "congestion":
        return inc.target in (fault.target, fault.target.replace("->", "/")) or inc.node == fault.node
    if fault.kind == "node_silent":
        return inc.target == fault.target or inc.node == fault.node
    return inc.target == fault.target.replace(":", "/", 1) or inc.target == fault.target


class Scorer:
    """Accumulates runs; `to_true(node, local_ns)` maps an incident's timestamp to true time."""

    def __init__(self) -> None:
        self.kinds: dict[str, KindScore] = {k: KindScore() for k in ACCEPTS}
        self.fault_free_incidents = 0
        self.fault_free_runs = 0
        self.false_positives: list[str] = []     # "kind target detail", for a reader to see what went wrong

    def add_run(self, faults: list[InjectedFault], incidents: Iterable[Incident],
                to_true: Callable[[str, int], int]) -> None:
        rows = first_rows(incidents)
        if not faults:
            self.fault_free_runs += 1
            self.fault_free_incidents += len(rows)
            self.false_positives += [f"{i.kind} {i.target} {i.detail[:80]}" for i in rows]
        detected: dict[str, int] = {}     # fault id -> earliest detecting incident's true time
        matched: set[str] = set()
        for inc in rows:
            t = to_true(inc.node, inc.ts_ns)
            for f in faults:
                if (inc.kind in ACCEPTS.get(f.kind, ()) and same_target(f, inc)
                        and f.start_ns - EARLY_NS <= t <= f.end_ns + LATE_NS):
                    matched.add(inc.incident_id)
                    detected[f.fault_id] = min(detected.get(f.fault_id, t), t)
        for inc in rows:
            score = self.kinds.setdefault(INCIDENT_KIND.get(inc.kind, inc.kind), KindScore())
            score.incidents += 1
            if inc.incident_id in matched:
                score.true_incidents += 1
            elif faults:
                self.false_positives.append(f"{inc.kind} {inc.target} {inc.detail[:80]}")
        for f in faults:
            score = self.kinds.setdefault(f.kind, KindScore())
            score.faults += 1
            if f.fault_id in detected:
                score.detected += 1
                score.latencies_ms.append(max(0.0, (detected[f.fault_id] - f.start_ns) / 1e6))

    def report(self) -> dict:
        per_kind = {k: s.as_dict() for k, s in self.kinds.items() if s.faults or s.incidents}
        total = KindScore()
        for s in self.kinds.values():
            total.faults += s.faults
            total.detected += s.detected
            total.incidents += s.incidents
            total.true_incidents += s.true_incidents
            total.latencies_ms += s.latencies_ms
        overall = total.as_dict()
        return {"kinds": per_kind, "fault_free_runs": self.fault_free_runs,
                "fault_free_incidents": self.fault_free_incidents, "precision": overall["precision"],
                "recall": overall["recall"], "latency_ms_p50": overall["latency_ms_p50"],
                "false_positives": self.false_positives[:20]}
