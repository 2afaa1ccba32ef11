"""GPU fault detection from NVML readings: XID, GPU lost, uncorrectable ECC, thermal throttle.

A lost GPU (or XID 79, "fell off the bus") cannot be recovered in place: the node must be drained and a spare
brought in. This detector runs per node and cannot see the fleet, so it asks (a `ReplacementRequest`, on
control.replacements); the fleet's one allocator (replacement_allocator.py) applies the fleet-wide budget,
picks a spare no other node holds, and orders `drain` and `spare` in an `update` row of this incident.

Thermal throttling opens an incident that resolves when the throttle bits clear. A null reading (not
supported, or GPU lost) is unknown: it neither opens nor resolves anything, and is no baseline: the ECC count
is compared only with an earlier known count (a counter that goes down was reset by a driver reload, and
becomes the new baseline).

Keyed by node (the records' own key); one state entry per GPU, "node|gpu", which expires `ttl_ns` of event
time after the GPU's newest reading (default 24 h; counted in `expired_open` if a thermal incident was open).
A redelivered reading is not applied again and re-emits what it emitted, its replacement request included
(delivery_log.py; the allocator answers a request it saw with the same outputs); counted in `redelivered`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from clocktower.schemas.analytics import Incident, IncidentKind
from clocktower.schemas.control import ReplacementRequest
from clocktower.schemas.event import Event
from clocktower.schemas.ids import bounded_name, stable_id
from clocktower.schemas.telemetry import GpuHealth
from clocktower.streams.detectors.delivery_log import DeliveryLog, Emitted
from clocktower.streams.detectors.replaying_detector import ReplayingDetector
from clocktower.streams.processor import Output

if TYPE_CHECKING:
    from clocktower.streams.processor_context import ProcessorContext

# NVML clocks-event reasons that mean "too hot" or "hardware slowdown".
THERMAL_BITS = 0x20 | 0x40 | 0x08  # SW thermal, HW thermal, HW slowdown
FATAL_XIDS = {48, 63, 64, 74, 79, 94, 95}
DEFAULT_GPU_TTL_NS = 24 * 3600 * 10**9
# How far before the worker's wall clock a GPU's first reading may date its start (`known_for_ns` of its
# requests). Further back, and a name invented for a forged fault could claim to be known at once. Not the
# partition's event time: whoever writes every record of a partition sets it, and it starts again at 0 after a
# restart (found in review). The wall clock makes this one value depend on when the reading is processed: a
# GPU whose first readings are processed more than this late (a worker catching up) is aged from then, so its
# faults in its first CLOCKTOWER_STREAMS_KNOWN_AFTER_S are held for approval. Like the allocator's other wall-clock
# rules (the budget, the fault's age), it is kept in the entry, so a replay does not change it.
BACKDATE_NS = 120 * 10**9


@dataclass
class Gpu:
    ecc_uncorrected: int | None = None   # last known uncorrectable ECC count; None until one is read
    lost: bool = False
    thermal_incident: str | None = None
    thermal_opened: int = 0
    since_ns: int = 0    # when the GPU began reporting, by event time, no earlier than BACKDATE_NS before the
                         # worker's clock then (0: an entry written before this was kept: known for long)
    log: DeliveryLog = field(default_factory=DeliveryLog)


class GpuFaultDetector(ReplayingDetector):
    """Returns incidents, and replacement requests for the allocator."""

    name: ClassVar[str] = "gpu_fault"
    consumes: ClassVar[tuple[type[Event], ...]] = (GpuHealth,)
    key_by: ClassVar[str] = "node"
    entry: ClassVar[type] = Gpu

    def __init__(self, *, ttl_ns: int = DEFAULT_GPU_TTL_NS, clock_ns: Callable[[], int] = time.time_ns) -> None:
        """`clock_ns`: the worker's wall clock (the remediation budget's), which bounds a first reading's date."""
        super().__init__(ttl_ns)
        self.clock_ns = clock_ns

    @classmethod
    def from_context(cls, ctx: ProcessorContext) -> GpuFaultDetector:
        return cls(clock_ns=ctx.remediation_budget.clock_ns)

    def is_open(self, entry: Gpu) -> bool:
        return entry.thermal_incident is not None

    def process(self, state: Any, event: Event) -> list[Output]:
        assert isinstance(event, GpuHealth)
        key = f"{event.node}|{event.gpu}"
        gpu: Gpu | None = state.get(key)
        if gpu is None:
            gpu = Gpu(since_ns=max(event.ts_ns, self.clock_ns() - BACKDATE_NS))   # a reading dated back ages it little
        elif gpu.log.was_applied(event.ts_ns, state.delivery, fault=bool(event.xid or event.lost)):
            self.redelivered += 1
            return list(gpu.log.outputs_of(event.ts_ns, state.delivery))
        out = self._apply(gpu, event)
        gpu.log.applied(event.ts_ns, out, state.delivery)
        state.put(key, gpu, gpu.log.newest + self.state_ttl_ns)
        return list(out)

    def _apply(self, gpu: Gpu, ev: GpuHealth) -> Emitted:
        out: Emitted = []
        if ev.xid:
            fatal = ev.xid in FATAL_XIDS
            inc = self._incident(ev, "gpu_xid", "open", "critical" if fatal else "warning", f"XID {ev.xid}")
            out += self._replace_node(ev, inc, gpu) if ev.xid == 79 and not gpu.lost else [inc]
            gpu.lost = gpu.lost or ev.xid == 79
        if ev.lost and not gpu.lost:
            gpu.lost = True
            out += self._replace_node(ev, self._incident(ev, "gpu_lost", "open", "critical", "GPU is lost"), gpu)
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

    @staticmethod
    def _replace_node(ev: GpuHealth, inc: Incident, gpu: Gpu) -> Emitted:
        """The node must be drained and replaced: the fleet's allocator decides (replacement_allocator.py), and
        spends its budget only on a node known for long enough (`known_for_ns`)."""
        request = ReplacementRequest(node=ev.node, ts_ns=ev.ts_ns, incident_id=inc.incident_id, reason=inc.kind,
                                     gpu=ev.gpu, known_for_ns=max(0, ev.ts_ns - gpu.since_ns))
        return [inc.model_copy(update={"detail": inc.detail + "; drain and spare asked of the fleet's allocator"}),
                request]
