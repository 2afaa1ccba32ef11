"""GPU fault detection from NVML readings, by what each fault means: XIDs, a lost GPU, ECC, heat.

One fault is one incident. Each hardware XID has a class in NVIDIA's catalogue (xid_catalogue.py: memory, NVLink,
bus, GSP, engine); a GPU has at most one open incident per class, and a repeat (XID 48 again, or 63 after 48, or
the uncorrectable ECC count rising with the XID) is an `update` row that counts it, so a repeated XID is visible.
Application XIDs (13, 31, 43, 45) open nothing: the application is at fault, not the GPU (`application_xids`
counts them). A class's incident resolves once the GPU has answered for `quiet_ns` of event time (default 60 s)
with no sign of that fault; its count starts again from zero then.

A lost GPU (or XID 79, "fell off the bus") cannot be recovered in place: the node must be drained and a spare
brought in. This detector runs per node and cannot see the fleet, so it asks (a `ReplacementRequest`, on
control.replacements); the fleet's one allocator (replacement_allocator.py) applies the fleet-wide budget,
picks a spare no other node holds, and orders `drain` and `spare` in an `update` row of this incident. The other
classes name the catalogue's recommended action in the incident (reset the GPU, check the NVLink, watch) and
order nothing: a reset needs the GPU's jobs gone, which is the operator's or the scheduler's call.

Heat is one `gpu_thermal` incident with two levels. A GPU at or above `warn_c` (default 85 C, below the usual
slowdown thresholds of 87-92 C) for two readings in a row, or within CLIMB_BAND_C of it and climbing at
CLIMB_C_PER_S or faster (an EWMA of the slope between readings: one reading's noise is not a climb), gets an early
warning before the throttle bit is set;
thermal or hardware slowdown bits (NVML clocks-event reasons 0x08, 0x20, 0x40) held for `sustain_ns` (default
0.5 s) raise it to critical (or open it so). A software power cap (0x04) is policy, not a fault, and opens nothing.
It resolves after two readings in a row unthrottled, at least `COOL_MARGIN_C` below `warn_c` and no longer
climbing.

A null reading (not supported, or GPU lost) is unknown: it neither opens nor resolves anything, and is no
baseline: the ECC count is compared only with an earlier known count (a counter that goes down was reset by a
driver reload, and becomes the new baseline).

Keyed by node (the records' own key); one state entry per GPU, "node|gpu", which expires `ttl_ns` of event
time after the GPU's newest reading (default 24 h; counted in `expired_open` if an incident was open).
A redelivered reading is not applied again and re-emits what it emitted, its replacement request included
(delivery_log.py; the allocator answers a request it saw with the same outputs); counted in `redelivered`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import orjson

from clocktower.schemas.analytics import Incident, IncidentKind
from clocktower.schemas.control import ReplacementRequest
from clocktower.schemas.event import Event
from clocktower.schemas.ids import bounded_name, stable_id
from clocktower.schemas.telemetry import GpuHealth
from clocktower.streams.detectors.delivery_log import DeliveryLog, Emitted
from clocktower.streams.detectors.replaying_detector import ReplayingDetector
from clocktower.streams.detectors.xid_catalogue import ECC_RISE, GPU_LOST, XidMeaning, meaning_of
from clocktower.streams.processor import Output

if TYPE_CHECKING:
    from clocktower.streams.processor_context import ProcessorContext

# NVML clocks-event reasons that mean "too hot" or "hardware slowdown" (0x04, the software power cap, is not one).
THERMAL_BITS = 0x20 | 0x40 | 0x08  # SW thermal, HW thermal, HW slowdown
DEFAULT_GPU_TTL_NS = 24 * 3600 * 10**9
DEFAULT_QUIET_NS = 60 * 10**9       # a fault class resolves after this long without a sign of it
DEFAULT_WARN_C = 85.0               # early thermal warning at or above this temperature
DEFAULT_SUSTAIN_NS = 500 * 10**6    # thermal throttling held this long is a fault
WARM_READINGS = 2                   # readings in a row at or above warn_c for the early warning
CLIMB_BAND_C = 10.0                 # ... or within this much below warn_c and climbing at CLIMB_C_PER_S or faster
CLIMB_C_PER_S = 5.0
SLOPE_ALPHA = 0.3                   # EWMA weight of the newest temperature slope (readings are noisy)
COOL_READINGS = 2                   # readings in a row cool and unthrottled to resolve
COOL_MARGIN_C = 3.0                 # cool: below warn_c by this much
SEVERITY_RANK = {"info": 0, "warning": 1, "critical": 2}
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
    # open fault classes: class -> [incident_id, opened_ns, last sign ns, count, severity, kind]
    faults: dict[str, list] = field(default_factory=dict)
    thermal_level: str = ""  # "", "warning" or "critical" while thermal_incident is open
    throttled_since: int = 0  # first reading of the current unbroken run of throttled readings (0: none)
    warm: int = 0             # readings in a row at or above warn_c
    cool: int = 0             # readings in a row cool and unthrottled
    temp_c: float | None = None   # the last known temperature, and when (for the climb's slope)
    temp_ns: int = 0
    slope: float = 0.0        # EWMA of the temperature's slope, C/s


class GpuFaultDetector(ReplayingDetector):
    """Returns incidents, and replacement requests for the allocator."""

    name: ClassVar[str] = "gpu_fault"
    consumes: ClassVar[tuple[type[Event], ...]] = (GpuHealth,)
    key_by: ClassVar[str] = "node"
    entry: ClassVar[type] = Gpu

    def __init__(self, *, ttl_ns: int = DEFAULT_GPU_TTL_NS, clock_ns: Callable[[], int] = time.time_ns,
                 quiet_ns: int = DEFAULT_QUIET_NS, warn_c: float = DEFAULT_WARN_C,
                 sustain_ns: int = DEFAULT_SUSTAIN_NS) -> None:
        """`clock_ns`: the worker's wall clock (the remediation budget's), which bounds a first reading's date."""
        super().__init__(ttl_ns)
        self.clock_ns = clock_ns
        self.quiet_ns, self.warn_c, self.sustain_ns = quiet_ns, warn_c, sustain_ns
        self.application_xids = 0   # XIDs that blame the application: no incident

    def counters(self) -> dict[str, int]:
        return {**super().counters(), "application_xids": self.application_xids}

    @classmethod
    def from_context(cls, ctx: ProcessorContext) -> GpuFaultDetector:
        return cls(clock_ns=ctx.remediation_budget.clock_ns)

    def is_open(self, entry: Gpu) -> bool:
        return entry.thermal_incident is not None or bool(entry.faults)

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
        signs: dict[str, tuple[XidMeaning, str]] = {}   # fault class -> what this reading shows of it
        reset = ""
        if ev.xid:
            m = meaning_of(ev.xid)
            if m.hardware:
                signs[m.fault] = (m, f"XID {ev.xid}: {m.meaning}")
            else:
                self.application_xids += 1
        if ev.ecc_uncorrected is not None:
            if gpu.ecc_uncorrected is not None and ev.ecc_uncorrected > gpu.ecc_uncorrected:
                what = f"uncorrectable ECC errors {gpu.ecc_uncorrected} -> {ev.ecc_uncorrected}"
                m, said = signs.get("memory", (ECC_RISE, ""))
                signs["memory"] = (m, f"{said}; {what}" if said else what)
            elif gpu.ecc_uncorrected is not None and ev.ecc_uncorrected < gpu.ecc_uncorrected:
                reset = f"ECC counter reset ({gpu.ecc_uncorrected} -> {ev.ecc_uncorrected}): driver reloaded"
            gpu.ecc_uncorrected = ev.ecc_uncorrected
        if ev.lost and "bus" not in signs and (not gpu.lost or "bus" in gpu.faults):
            signs["bus"] = (GPU_LOST, GPU_LOST.meaning)
        for fault, (m, what) in signs.items():
            out += self._sign(gpu, ev, fault, m, what)
        out += self._recovered(gpu, ev, signs, reset)
        return out + self._thermal(gpu, ev)

    def _sign(self, gpu: Gpu, ev: GpuHealth, fault: str, m: XidMeaning, what: str) -> Emitted:
        """One reading's sign of a fault class: opens its incident, or counts a repeat in an update row."""
        evidence = {"xid": ev.xid, "class": fault, "action": m.action, "temperature_c": ev.temperature_c,
                    "ecc_uncorrected": ev.ecc_uncorrected, "lost": ev.lost}
        open_ = gpu.faults.get(fault)
        if open_ is not None:
            incident_id, opened, _, count, severity, kind = open_
            if ev.lost and not ev.xid and fault == "bus":   # still lost: the same sign, not a repeat
                open_[2] = ev.ts_ns
                return []
            count += 1
            severity = max(severity, m.severity, key=SEVERITY_RANK.__getitem__)
            gpu.faults[fault] = [incident_id, opened, ev.ts_ns, count, severity, kind]
            return [self._incident(ev, kind, "update", severity, f"{what} (repeat: {count} since it opened); "
                                   f"recommended: {m.action}", incident_id, opened, {**evidence, "count": count})]
        inc = self._incident(ev, m.kind, "open", m.severity, f"{what}; recommended: {m.action}",
                             evidence={**evidence, "count": 1})
        gpu.faults[fault] = [inc.incident_id, ev.ts_ns, ev.ts_ns, 1, m.severity, m.kind]
        if fault == "bus" and not gpu.lost:
            gpu.lost = True
            return self._replace_node(ev, inc, gpu)
        return [inc]

    def _recovered(self, gpu: Gpu, ev: GpuHealth, signs: dict, ecc_reset: str) -> Emitted:
        """Fault classes with no sign for `quiet_ns` on a GPU that answers, and a memory fault whose ECC counter was
        reset (a driver reload or GPU reset): resolved, their counts reset."""
        if ev.lost:
            return []
        out: Emitted = []
        for fault, (incident_id, opened, last, count, _, kind) in list(gpu.faults.items()):
            if fault in signs:
                continue
            if fault == "memory" and ecc_reset:
                why = ecc_reset
            elif ev.ts_ns - last >= self.quiet_ns:
                why = f"no sign of it for {(ev.ts_ns - last) / 1e9:.0f} s and the GPU answers"
            else:
                continue
            del gpu.faults[fault]
            gpu.lost = gpu.lost and fault != "bus"
            out.append(self._incident(ev, kind, "resolve", "info", f"{why}; {count} seen, count reset",
                                      incident_id, opened, {"class": fault, "count": count}))
        return out

    def _thermal(self, gpu: Gpu, ev: GpuHealth) -> Emitted:
        if ev.throttle_reasons is None or ev.lost:
            return []   # unknown: neither opens nor resolves
        throttled = bool(ev.throttle_reasons & THERMAL_BITS)
        temp = ev.temperature_c
        warm = temp is not None and temp >= self.warn_c
        gpu.throttled_since = (gpu.throttled_since or ev.ts_ns) if throttled else 0
        gpu.warm = gpu.warm + 1 if warm else 0
        if temp is not None:
            if gpu.temp_c is not None and ev.ts_ns > gpu.temp_ns:
                rate = (temp - gpu.temp_c) / ((ev.ts_ns - gpu.temp_ns) / 1e9)
                gpu.slope += SLOPE_ALPHA * (rate - gpu.slope)
            gpu.temp_c, gpu.temp_ns = temp, ev.ts_ns
        climbing = (temp is not None and temp >= self.warn_c - CLIMB_BAND_C and gpu.slope >= CLIMB_C_PER_S)
        cool = (not throttled and (temp is None or temp < self.warn_c - COOL_MARGIN_C)
                and gpu.slope < CLIMB_C_PER_S / 2)
        gpu.cool = gpu.cool + 1 if cool else 0
        evidence = {"temperature_c": temp, "throttle_reasons": ev.throttle_reasons, "warn_c": self.warn_c,
                    "sm_clock_mhz": ev.sm_clock_mhz, "slope_c_per_s": round(gpu.slope, 2),
                    "throttled_for_ms": (ev.ts_ns - gpu.throttled_since) / 1e6 if throttled else 0.0}
        shown = "temperature unknown" if temp is None else f"{temp:.0f} C"
        if throttled and ev.ts_ns - gpu.throttled_since >= self.sustain_ns and gpu.thermal_level != "critical":
            detail = (f"thermal slowdown for {(ev.ts_ns - gpu.throttled_since) / 1e6:.0f} ms: throttle reasons "
                      f"0x{ev.throttle_reasons:x}, {shown}, SM clock {ev.sm_clock_mhz} MHz")
            state = "update" if gpu.thermal_incident else "open"
            inc = self._incident(ev, "gpu_thermal", state, "critical", detail, gpu.thermal_incident,
                                 gpu.thermal_opened or None, evidence)
            if state == "open":
                gpu.thermal_incident, gpu.thermal_opened = inc.incident_id, ev.ts_ns
            gpu.thermal_level = "critical"
            return [inc]
        if gpu.thermal_incident is None and (gpu.warm >= WARM_READINGS or climbing):
            why = (f"at or above {self.warn_c:.0f} C" if gpu.warm >= WARM_READINGS else
                   f"climbing {gpu.slope:.0f} C/s toward {self.warn_c:.0f} C")
            inc = self._incident(ev, "gpu_thermal", "open", "warning", f"early warning: {shown}, {why}, not yet "
                                 "throttled", evidence=evidence)
            gpu.thermal_incident, gpu.thermal_opened, gpu.thermal_level = inc.incident_id, ev.ts_ns, "warning"
            return [inc]
        if gpu.thermal_incident is not None and gpu.cool >= COOL_READINGS:
            inc = self._incident(ev, "gpu_thermal", "resolve", "info", f"cooled to {shown}, unthrottled",
                                 gpu.thermal_incident, gpu.thermal_opened, evidence)
            gpu.thermal_incident, gpu.thermal_opened, gpu.thermal_level = None, 0, ""
            return [inc]
        return []

    def _incident(self, ev: GpuHealth, kind: IncidentKind, state: str, severity: str, detail: str,
                  incident_id: str | None = None, opened_ns: int | None = None,
                  evidence: dict | None = None) -> Incident:
        return Incident(node=ev.node, ts_ns=ev.ts_ns,
                        incident_id=incident_id or stable_id(kind, ev.node, f"gpu{ev.gpu}", ev.ts_ns),
                        kind=kind, state=state, severity=severity, target=bounded_name(f"{ev.node}/gpu{ev.gpu}"),
                        opened_ns=opened_ns or ev.ts_ns, detail=detail,
                        evidence=orjson.dumps(evidence).decode() if evidence else "")

    @staticmethod
    def _replace_node(ev: GpuHealth, inc: Incident, gpu: Gpu) -> Emitted:
        """The node must be drained and replaced: the fleet's allocator decides (replacement_allocator.py), and
        spends its budget only on a node known for long enough (`known_for_ns`)."""
        request = ReplacementRequest(node=ev.node, ts_ns=ev.ts_ns, incident_id=inc.incident_id, reason=inc.kind,
                                     gpu=ev.gpu, known_for_ns=max(0, ev.ts_ns - gpu.since_ns))
        return [inc.model_copy(update={"detail": inc.detail + "; drain and spare asked of the fleet's allocator"}),
                request]
