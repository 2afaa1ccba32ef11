"""GPU fault detection from NVML readings: XID, GPU lost, uncorrectable ECC, thermal throttle.

A lost GPU (or XID 79, "fell off the bus") cannot be recovered in place: the
detector asks for the node to be drained and a spare brought in. Thermal
throttling opens an incident that resolves when the throttle bits clear.
A null reading (not supported, or GPU lost) is unknown: it neither opens nor resolves anything, and
is no baseline: the ECC count is compared only with an earlier known count (a counter that goes down was
reset by a driver reload, and becomes the new baseline).
"""

from __future__ import annotations

from dataclasses import dataclass

from clocktower.control.intent import CommandIntent
from clocktower.schemas.analytics import Incident, IncidentKind
from clocktower.schemas.ids import bounded_name, stable_id
from clocktower.schemas.telemetry import GpuHealth
from clocktower.streams.remediation_budget import RemediationBudget

# NVML clocks-event reasons that mean "too hot" or "hardware slowdown".
THERMAL_BITS = 0x20 | 0x40 | 0x08  # SW thermal, HW thermal, HW slowdown
FATAL_XIDS = {48, 63, 64, 74, 79, 94, 95}


@dataclass
class _Gpu:
    ecc_uncorrected: int | None = None   # last known uncorrectable ECC count; None until one is read
    lost: bool = False
    thermal_incident: str | None = None
    thermal_opened: int = 0


class GpuFaultDetector:
    """Returns incidents and unsigned command intents; the streams' edge signs the intents."""

    def __init__(self, *, budget: RemediationBudget | None = None) -> None:
        self.budget = budget or RemediationBudget()
        self.gpus: dict[tuple[str, int], _Gpu] = {}

    def _incident(self, ev: GpuHealth, kind: IncidentKind, state: str, severity: str, detail: str,
                  incident_id: str | None = None, opened_ns: int | None = None) -> Incident:
        return Incident(node=ev.node, ts_ns=ev.ts_ns,
                        incident_id=incident_id or stable_id(kind, ev.node, f"gpu{ev.gpu}", ev.ts_ns),
                        kind=kind, state=state, severity=severity, target=bounded_name(f"{ev.node}/gpu{ev.gpu}"),
                        opened_ns=opened_ns or ev.ts_ns, detail=detail)

    def _replace_node(self, ev: GpuHealth, inc: Incident) -> list[Incident | CommandIntent]:
        if not self.budget.allow():
            b = self.budget
            note = (f"; drain and spare withheld, needs human approval: the fleet limit of {b.max_per_window} "
                    f"replacements per {b.window_ns / 1e9:g} s is reached")
            return [inc.model_copy(update={"detail": inc.detail + note})]
        return [inc, CommandIntent(ev.node, "drain", ev.node, ev.ts_ns, inc.incident_id,
                                   {"reason": inc.kind, "gpu": str(ev.gpu)}),
                CommandIntent(ev.node, "spare", ev.node, ev.ts_ns, inc.incident_id, {"replace": ev.node})]

    def on_gpu_health(self, ev: GpuHealth) -> list[Incident | CommandIntent]:
        gpu = self.gpus.setdefault((ev.node, ev.gpu), _Gpu())
        out: list[Incident | CommandIntent] = []
        if ev.xid:
            fatal = ev.xid in FATAL_XIDS
            inc = self._incident(ev, "gpu_xid", "open", "critical" if fatal else "warning", f"XID {ev.xid}")
            out += self._replace_node(ev, inc) if ev.xid == 79 and not gpu.lost else [inc]
            gpu.lost = gpu.lost or ev.xid == 79
        if ev.lost and not gpu.lost:
            gpu.lost = True
            out += self._replace_node(ev, self._incident(ev, "gpu_lost", "open", "critical", "GPU is lost"))
        if ev.ecc_uncorrected is not None:
            if gpu.ecc_uncorrected is not None and ev.ecc_uncorrected > gpu.ecc_uncorrected:
                out.append(self._incident(ev, "gpu_ecc", "open", "critical",
                                          f"uncorrectable ECC errors {gpu.ecc_uncorrected} -> {ev.ecc_uncorrected}"))
            gpu.ecc_uncorrected = ev.ecc_uncorrected
        if ev.throttle_reasons is None:
            return out
        throttled = bool(ev.throttle_reasons & THERMAL_BITS)
        if throttled and gpu.thermal_incident is None:
            temp = "temperature unknown" if ev.temperature_c is None else f"{ev.temperature_c:.0f} C"
            inc = self._incident(ev, "gpu_thermal", "open", "warning",
                                 f"throttle reasons 0x{ev.throttle_reasons:x}, {temp}")
            gpu.thermal_incident, gpu.thermal_opened = inc.incident_id, ev.ts_ns
            out.append(inc)
        elif not throttled and gpu.thermal_incident is not None and not ev.lost:
            out.append(self._incident(ev, "gpu_thermal", "resolve", "info", "throttling cleared",
                                      gpu.thermal_incident, gpu.thermal_opened))
            gpu.thermal_incident = None
        return out
