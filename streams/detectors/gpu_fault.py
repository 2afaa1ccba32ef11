"""GPU fault detection from NVML readings: XID, GPU lost, uncorrectable ECC, thermal throttle.

A lost GPU (or XID 79, "fell off the bus") cannot be recovered in place: the detector asks for the node to be
drained (`drain`, to the faulty node) and a spare brought in (`spare` {"replaces": faulty node}, to a node of
the configured spare pool, which runs the spare's hook), within the fleet's RemediationBudget (in-memory, one
per worker, on the worker's processing clock: see remediation_budget.py). The spare is picked from the pool
(less the faulty node) by a hash of the faulty node's name: deterministic, so a replay picks the same one.
Node-keyed state cannot allocate across nodes: two nodes failing at once may be sent the same spare (its hook
must refuse a second activation). With an empty pool no `spare` is ordered and the incident says so.

Thermal throttling opens an incident that resolves when the throttle bits clear. A null reading (not
supported, or GPU lost) is unknown: it neither opens nor resolves anything, and is no baseline: the ECC count
is compared only with an earlier known count (a counter that goes down was reset by a driver reload, and
becomes the new baseline).

Keyed by node (the records' own key); one state entry per GPU, "node|gpu", which expires `ttl_ns` of event
time after the GPU's newest reading (default 24 h; counted in `expired_open` if a thermal incident was open).
A redelivered reading is not applied again and re-emits what it emitted, without asking the budget again
(delivery_log.py); those are counted in `redelivered`.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from clocktower.control.intent import CommandIntent, command_id_of
from clocktower.schemas.analytics import Incident, IncidentKind
from clocktower.schemas.event import Event
from clocktower.schemas.ids import bounded_name, stable_id
from clocktower.schemas.telemetry import GpuHealth
from clocktower.streams.detectors.delivery_log import DeliveryLog, Emitted
from clocktower.streams.detectors.replaying_detector import ReplayingDetector
from clocktower.streams.processor import Output
from clocktower.streams.remediation_budget import RemediationBudget

if TYPE_CHECKING:
    from clocktower.streams.processor_context import ProcessorContext

# NVML clocks-event reasons that mean "too hot" or "hardware slowdown".
THERMAL_BITS = 0x20 | 0x40 | 0x08  # SW thermal, HW thermal, HW slowdown
FATAL_XIDS = {48, 63, 64, 74, 79, 94, 95}
DEFAULT_GPU_TTL_NS = 24 * 3600 * 10**9


@dataclass
class Gpu:
    ecc_uncorrected: int | None = None   # last known uncorrectable ECC count; None until one is read
    lost: bool = False
    thermal_incident: str | None = None
    thermal_opened: int = 0
    log: DeliveryLog = field(default_factory=DeliveryLog)


class GpuFaultDetector(ReplayingDetector):
    """Returns incidents and unsigned command intents; the streams' edge signs the intents."""

    name: ClassVar[str] = "gpu_fault"
    consumes: ClassVar[tuple[type[Event], ...]] = (GpuHealth,)
    key_by: ClassVar[str] = "node"
    entry: ClassVar[type] = Gpu

    def __init__(self, *, budget: RemediationBudget | None = None, spare_nodes: tuple[str, ...] = (),
                 ttl_ns: int = DEFAULT_GPU_TTL_NS) -> None:
        super().__init__(ttl_ns)
        self.budget = budget if budget is not None else RemediationBudget()
        self.spare_nodes = tuple(spare_nodes)

    @classmethod
    def from_context(cls, ctx: ProcessorContext) -> GpuFaultDetector:
        return cls(budget=ctx.remediation_budget, spare_nodes=ctx.spare_nodes)

    def spare_for(self, node: str) -> str | None:
        """The pool's spare for `node` (never itself), picked by a hash of its name; None if the pool has none."""
        pool = [n for n in self.spare_nodes if n != node]
        return pool[zlib.crc32(node.encode()) % len(pool)] if pool else None

    def is_open(self, entry: Gpu) -> bool:
        return entry.thermal_incident is not None

    def process(self, state: Any, event: Event) -> list[Output]:
        assert isinstance(event, GpuHealth)
        key = f"{event.node}|{event.gpu}"
        gpu: Gpu | None = state.get(key)
        if gpu is None:
            gpu = Gpu()
        elif gpu.log.was_applied(event.ts_ns):
            self.redelivered += 1
            return list(gpu.log.outputs_of(event.ts_ns))
        out = self._apply(gpu, event)
        gpu.log.applied(event.ts_ns, out)
        state.put(key, gpu, gpu.log.newest + self.state_ttl_ns)
        return list(out)

    def _apply(self, gpu: Gpu, ev: GpuHealth) -> Emitted:
        out: Emitted = []
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

    def _incident(self, ev: GpuHealth, kind: IncidentKind, state: str, severity: str, detail: str,
                  incident_id: str | None = None, opened_ns: int | None = None) -> Incident:
        return Incident(node=ev.node, ts_ns=ev.ts_ns,
                        incident_id=incident_id or stable_id(kind, ev.node, f"gpu{ev.gpu}", ev.ts_ns),
                        kind=kind, state=state, severity=severity, target=bounded_name(f"{ev.node}/gpu{ev.gpu}"),
                        opened_ns=opened_ns or ev.ts_ns, detail=detail)

    def _replace_node(self, ev: GpuHealth, inc: Incident) -> Emitted:
        if not self.budget.allow():
            b = self.budget
            note = (f"; drain and spare withheld, needs human approval: the fleet limit of {b.max_per_window} "
                    f"replacements per {b.window_ns / 1e9:g} s is reached")
            return [inc.model_copy(update={"detail": inc.detail + note})]
        cmds = [CommandIntent(ev.node, "drain", ev.node, ev.ts_ns, inc.incident_id,
                              {"reason": inc.kind, "gpu": str(ev.gpu)})]
        spare = self.spare_for(ev.node)
        note = ""
        if spare is None:
            note = "; no spare node configured (CLOCKTOWER_STREAMS_SPARE_NODES): no spare ordered"
        else:
            cmds.append(CommandIntent(spare, "spare", spare, ev.ts_ns, inc.incident_id, {"replaces": ev.node}))
        return [inc.model_copy(update={"detail": inc.detail + note, "command_ids": [command_id_of(c) for c in cmds]}),
                *cmds]

