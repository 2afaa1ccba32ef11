"""The default fault schedule, scaled to the run, and queries on it.

Each fault is one `InjectedFault` ground-truth event (true-time start/end,
`node` = the faulty node) plus the parameters the producers need to act it
out. Targets are taken modulo the fleet size, so any fleet of two or more
nodes gets every fault. All times are true ns; node-N below is node N (named `node-N.demo`).

| kind        | when (D = duration)  | target                     | effect |
|-------------|----------------------|----------------------------|--------|
| link_flap   | 0.2 D, 6 transitions | node-1:eth0                | down/up x3, 0.3 s apart |
| link_blip   | 0.28 D, 30 ms        | node-2:eth0                | down for 30 ms (under the 50 ms watchdog), once |
| congestion  | 0.35 D for 0.15 D    | node-2->node-3             | 50-500 µs queueing, slower comm |
| gpu_thermal | 0.45 D for 0.15 D    | node-0:gpu3                | 90-95 C, throttle 0x60, 1200 MHz, 1.3x |
| gpu_xid     | 0.6 D, permanent     | node-3:gpu5                | one reading with XID 79, then lost |
| gpu_ecc     | 0.7 D                | node-2:gpu1                | ecc_uncorrected 0 -> 1, XID 48 once |
| straggler   | 0.8 D for 0.1 D      | job-demo:rank9 (node-1:gpu1) | 1.5x compute |
| node_silent | 0.92 D for 0.06 D    | node-(N-1)                 | sends nothing at all (agent dead, host hung) |

node_silent is in the default schedule only on runs of SILENT_MIN_RUN_S or more: on a shorter one its window
would be shorter than the silence the detector waits for (1 s).

A thermal fault's window starts when the temperature starts to climb: it reaches the GPU's slowdown
threshold (`SLOWDOWN_C`) `ramp_ns` later (`THERMAL_RAMP_S`, or a third of a short run's window), and only then
is the throttle bit set and the rank slowed.

`schedule="random"` (SimConfig) draws every kind once instead, for scoring detectors on many schedules
(benchmarks/detection.py): after a fault-free warm-up of `WARMUP_FRACTION` of the run (the detectors learn
their baselines), the rest is cut into one slot per kind, in random order; each fault starts 10-40 % into its
slot and lasts 25-45 % of it (an XID 79 is permanent, a blip 30 ms, a silent node at least `SILENT_MIN_S`: the
detector waits 1 s of silence), so no two faults overlap and each incident has one cause. Targets, the XID, the
straggler's slowdown and the flap's spacing are drawn too.
"""

from __future__ import annotations

import random
from bisect import bisect_right
from dataclasses import dataclass

from clocktower.producers.simulator.config import SimConfig
from clocktower.producers.simulator.topology import JOB_ID, PRIMARY, Topology, node_id
from clocktower.schemas.operations import InjectedFault

S = 1_000_000_000
FLAP_TRANSITIONS = 6
FLAP_SPACING_S = 0.3
THERMAL_SLOWDOWN = 1.3
STRAGGLER_SLOWDOWN = 1.5
THERMAL_THROTTLE = 0x40 | 0x20   # NVML HW thermal slowdown | SW thermal slowdown
XID_GPU_LOST = 79
XID_ECC = 48
RANDOM_XIDS = (79, 74, 119)     # gpu_xid in random schedules: off the bus, NVLink, GSP timeout
RANDOM_ECC_XIDS = (48, 95)      # gpu_ecc in random schedules: double-bit, uncontained (each with an ECC rise)
SLOWDOWN_C = 88.0               # the simulated GPUs' slowdown threshold: throttling starts here
THERMAL_RAMP_S = 1.0            # from the start of the climb to SLOWDOWN_C
WARMUP_FRACTION = 0.15
SILENT_MIN_RUN_S = 30.0
SILENT_MIN_S = 2.0              # a random schedule's silent node stays silent at least this long
BLIP_NS = 30_000_000            # link_blip: carrier lost this long, under the streams' 50 ms watchdog
KINDS = ("link_flap", "link_blip", "congestion", "gpu_thermal", "gpu_xid", "gpu_ecc", "straggler", "node_silent")


def default_kinds(duration_s: float) -> tuple[str, ...]:
    """The kinds the default schedule injects on a run this long (node_silent needs SILENT_MIN_RUN_S)."""
    return KINDS if duration_s >= SILENT_MIN_RUN_S else tuple(k for k in KINDS if k != "node_silent")


@dataclass(frozen=True)
class FaultWindow:
    """One injected fault: its ground-truth event and what the producers act out."""

    fault: InjectedFault
    kind: str
    node: int
    start_ns: int
    end_ns: int
    gpu: int = -1
    peer: int = -1
    interface: str = ""
    factor: float = 1.0
    transitions: tuple[int, ...] = ()   # link_flap, link_blip: true times of down, up, down, ...
    xid: int = 0                        # gpu_xid, gpu_ecc: the XID reported (79: the GPU is lost after it)
    ramp_ns: int = 0                    # gpu_thermal: the climb to SLOWDOWN_C before throttling starts

    def active(self, t: int) -> bool:
        return self.start_ns <= t <= self.end_ns


class FaultSchedule:
    """The faults of one run, known up front."""

    def __init__(self, config: SimConfig, topo: Topology, start_ns: int) -> None:
        self.topo = topo
        make = _random_windows if config.schedule == "random" else _default_windows
        self.windows: list[FaultWindow] = make(config, topo, start_ns) if config.faults else []
        self.faults: list[InjectedFault] = [w.fault for w in self.windows]
        self._flaps: dict[tuple[int, str], tuple[int, ...]] = {}   # a port's changes, of every fault on it
        for w in self.windows:
            if w.transitions:
                port = (w.node, w.interface)
                self._flaps[port] = tuple(sorted(self._flaps.get(port, ()) + w.transitions))
        self._slow: dict[int, list[FaultWindow]] = {}
        for w in self.windows:
            if w.kind in ("gpu_thermal", "straggler"):
                self._slow.setdefault(topo.rank(w.node, w.gpu), []).append(w)
        self._congested = [w for w in self.windows if w.kind == "congestion"]
        self._congested_links: dict[tuple[int, int], list[FaultWindow]] = {}
        for w in self._congested:
            self._congested_links.setdefault((w.node, w.peer), []).append(w)
        self._thermal = {(w.node, w.gpu): w for w in self.windows if w.kind == "gpu_thermal"}
        self._xid = {(w.node, w.gpu): w for w in self.windows if w.kind == "gpu_xid"}
        self._ecc = {(w.node, w.gpu): w for w in self.windows if w.kind == "gpu_ecc"}
        self._silent = [w for w in self.windows if w.kind == "node_silent"]

    def by_kind(self, kind: str) -> list[FaultWindow]:
        return [w for w in self.windows if w.kind == kind]

    def active(self, t: int, kind: str | None = None) -> list[FaultWindow]:
        """Faults in effect at true time `t` (optionally of one kind)."""
        return [w for w in self.windows if w.active(t) and (kind is None or w.kind == kind)]

    def is_active(self, fault: str, t: int) -> bool:
        """Whether the fault with this id, or any fault of this kind, is in effect at `t`."""
        return any(w.active(t) for w in self.windows if fault in (w.fault.fault_id, w.kind))

    # --- links -------------------------------------------------------------------------------

    def link_transitions(self, node: int, interface: str) -> tuple[int, ...]:
        """True times at which the port changes state (first one goes down)."""
        return self._flaps.get((node, interface), ())

    def flapping(self, node: int) -> bool:
        """Whether any port of `node` ever changes state in this run."""
        return any(n == node for n, _ in self._flaps)

    def link_up(self, node: int, interface: str, t: int) -> bool:
        tr = self._flaps.get((node, interface))
        return not tr or bisect_right(tr, t) % 2 == 0

    def congested(self, src: int, dst: int, t: int) -> bool:
        """Whether the directed link src -> dst is congested at `t`."""
        windows = self._congested_links.get((src, dst))
        return windows is not None and any(w.active(t) for w in windows)

    def silent_between(self, t0: int, t1: int) -> dict[str, FaultWindow]:
        """The nodes (by id) silenced at some time in [t0, t1], with their windows."""
        return {w.fault.node: w for w in self._silent if w.start_ns <= t1 and w.end_ns >= t0}

    def any_congested(self, t: int) -> bool:
        return any(w.active(t) for w in self._congested)

    # --- GPUs and ranks ----------------------------------------------------------------------

    def compute_factor(self, rank: int, t: int) -> float:
        """How much slower than normal a rank computes at `t` (thermal, straggler)."""
        f = 1.0
        for w in self._slow.get(rank, ()):
            if w.active(t) and t >= w.start_ns + w.ramp_ns:
                f *= w.factor   # a thermal fault slows the rank once it is throttled, after its climb
        return f

    def thermal(self, node: int, gpu: int, t: int) -> bool:
        return self.thermal_window(node, gpu, t) is not None

    def thermal_window(self, node: int, gpu: int, t: int) -> FaultWindow | None:
        """The thermal fault of this GPU in effect at `t`, if any."""
        w = self._thermal.get((node, gpu))
        return w if w is not None and w.active(t) else None

    def xid_window(self, node: int, gpu: int) -> FaultWindow | None:
        return self._xid.get((node, gpu))

    def ecc_window(self, node: int, gpu: int) -> FaultWindow | None:
        return self._ecc.get((node, gpu))


def _add(windows: list[FaultWindow], run_start_ns: int, kind: str, node: int, target: str, start: int, end: int,
         detail: str, **kw: object) -> None:
    """Append one fault: its ground-truth event (id: kind, position, run start) and its window."""
    fault_id = f"{kind}-{len(windows) + 1}-{run_start_ns}"
    fault = InjectedFault(node=node_id(node), ts_ns=start, fault_id=fault_id, kind=kind,
                          target=target, start_ns=start, end_ns=end, detail=detail)
    windows.append(FaultWindow(fault=fault, kind=kind, node=node, start_ns=start, end_ns=end, **kw))  # type: ignore[arg-type]


def _default_windows(config: SimConfig, topo: Topology, start_ns: int) -> list[FaultWindow]:
    d = config.duration_s
    n, g = topo.nodes, topo.gpus_per_node

    def at(frac: float) -> int:
        return start_ns + round(frac * d * S)

    windows: list[FaultWindow] = []

    def add(kind: str, node: int, target: str, start: int, end: int, detail: str, **kw: object) -> None:
        _add(windows, start_ns, kind, node, target, start, end, detail, **kw)

    # Six transitions 0.3 s apart (closer on very short runs, so the flap ends inside the run).
    spacing = round(min(FLAP_SPACING_S, 0.7 * d / (FLAP_TRANSITIONS - 1)) * S)
    t0 = at(0.2)
    flips = tuple(t0 + i * spacing for i in range(FLAP_TRANSITIONS))
    node = 1 % n
    add("link_flap", node, f"{node_id(node)}:{PRIMARY}", flips[0], flips[-1],
        f"{PRIMARY} down/up {FLAP_TRANSITIONS // 2} times, {spacing / 1e9:.2f} s apart, then stays up",
        interface=PRIMARY, transitions=flips)

    node, t = 2 % n, at(0.28)
    add("link_blip", node, f"{node_id(node)}:{PRIMARY}", t, t + BLIP_NS,
        f"{PRIMARY} down for {BLIP_NS / 1e6:.0f} ms, once (under the watchdog: no failover)", interface=PRIMARY,
        transitions=(t, t + BLIP_NS))

    src, dst = 2 % n, 3 % n
    add("congestion", src, f"{node_id(src)}->{node_id(dst)}", at(0.35), at(0.50),
        "50-500 us of queueing on the link, all-reduce buckets slow down", peer=dst)

    node, gpu = 0, 3 % g
    add("gpu_thermal", node, f"{node_id(node)}:gpu{gpu}", at(0.45), at(0.60),
        f"90-95 C, throttle_reasons 0x{THERMAL_THROTTLE:x}, SM clock ~1200 MHz, "
        f"rank {topo.rank(node, gpu)} computes {THERMAL_SLOWDOWN}x slower",
        gpu=gpu, factor=THERMAL_SLOWDOWN, ramp_ns=min(round(THERMAL_RAMP_S * S), (at(0.60) - at(0.45)) // 3))

    node, gpu = 3 % n, 5 % g
    add("gpu_xid", node, f"{node_id(node)}:gpu{gpu}", at(0.6), at(1.0),
        f"XID {XID_GPU_LOST}: GPU fell off the bus (permanent; end_ns is the end of the run)", gpu=gpu,
        xid=XID_GPU_LOST)

    node, gpu = 2 % n, 1 % g
    t = at(0.7)
    add("gpu_ecc", node, f"{node_id(node)}:gpu{gpu}", t, t,
        f"one uncorrectable ECC error (ecc_uncorrected 0 -> 1), XID {XID_ECC}", gpu=gpu, xid=XID_ECC)

    node, gpu = 1 % n, 1 % g
    rank = topo.rank(node, gpu)
    add("straggler", node, f"{JOB_ID}:rank{rank}", at(0.8), at(0.9),
        f"rank {rank} ({node_id(node)}:gpu{gpu}) computes {STRAGGLER_SLOWDOWN}x slower",
        gpu=gpu, factor=STRAGGLER_SLOWDOWN)

    if "node_silent" in default_kinds(d):
        node = n - 1
        add("node_silent", node, node_id(node), at(0.92), at(0.98),
            "the node sends nothing at all: no heartbeat, GPU, link, flow, probe or training event")
    return windows


def _random_windows(config: SimConfig, topo: Topology, start_ns: int) -> list[FaultWindow]:
    """Every kind once, in random order, targets and strengths (the module's docstring)."""
    rng = random.Random(f"{config.seed}:schedule")
    n, g = topo.nodes, topo.gpus_per_node
    d = round(config.duration_s * S)
    warmup = round(WARMUP_FRACTION * d)
    slot = (d - warmup) // len(KINDS)
    order = rng.sample(KINDS, len(KINDS))
    gpus = rng.sample([(a, b) for a in range(n) for b in range(g)], 3)   # thermal, xid, ecc: three distinct GPUs
    windows: list[FaultWindow] = []

    def add(kind: str, node: int, target: str, start: int, end: int, detail: str, **kw: object) -> None:
        _add(windows, start_ns, kind, node, target, start, end, detail, **kw)

    for i, kind in enumerate(order):
        t0 = start_ns + warmup + i * slot + round(rng.uniform(0.1, 0.4) * slot)
        t1 = t0 + round(rng.uniform(0.25, 0.45) * slot)
        if kind == "link_flap":
            node = rng.randrange(n)
            spacing = round(rng.uniform(0.15, 0.4) * S)
            flips = tuple(t0 + k * spacing for k in range(FLAP_TRANSITIONS))
            add(kind, node, f"{node_id(node)}:{PRIMARY}", flips[0], flips[-1],
                f"{PRIMARY} down/up {FLAP_TRANSITIONS // 2} times, {spacing / 1e9:.2f} s apart",
                interface=PRIMARY, transitions=flips)
        elif kind == "link_blip":
            node = rng.randrange(n)
            add(kind, node, f"{node_id(node)}:{PRIMARY}", t0, t0 + BLIP_NS,
                f"{PRIMARY} down for {BLIP_NS / 1e6:.0f} ms, once", interface=PRIMARY, transitions=(t0, t0 + BLIP_NS))
        elif kind == "congestion":
            src = rng.randrange(n)
            dst = (src + 1) % n
            add(kind, src, f"{node_id(src)}->{node_id(dst)}", t0, t1, "50-500 us of queueing on the link", peer=dst)
        elif kind == "gpu_thermal":
            node, gpu = gpus[0]
            add(kind, node, f"{node_id(node)}:gpu{gpu}", t0, t1,
                f"climbs to {SLOWDOWN_C:.0f} C in {THERMAL_RAMP_S} s, then throttled at 90-95 C, "
                f"rank {topo.rank(node, gpu)} computes {THERMAL_SLOWDOWN}x slower", gpu=gpu, factor=THERMAL_SLOWDOWN,
                ramp_ns=round(THERMAL_RAMP_S * S))
        elif kind == "gpu_xid":
            node, gpu = gpus[1]
            xid = rng.choice(RANDOM_XIDS)
            end = start_ns + d if xid == XID_GPU_LOST else t0
            add(kind, node, f"{node_id(node)}:gpu{gpu}", t0, end,
                f"XID {xid}" + (": GPU fell off the bus (permanent)" if xid == XID_GPU_LOST else ", once"),
                gpu=gpu, xid=xid)
        elif kind == "gpu_ecc":
            node, gpu = gpus[2]
            xid = rng.choice(RANDOM_ECC_XIDS)
            add(kind, node, f"{node_id(node)}:gpu{gpu}", t0, t0,
                f"one uncorrectable ECC error (ecc_uncorrected +1), XID {xid}", gpu=gpu, xid=xid)
        elif kind == "node_silent":
            node = rng.randrange(1, n)   # not node 0: the clock sync's reference
            add(kind, node, node_id(node), t0, max(t1, t0 + round(SILENT_MIN_S * S)), "the node sends nothing at all")
        else:
            rank = rng.randrange(topo.ranks)
            node, gpu = divmod(rank, g)
            factor = round(rng.uniform(1.3, 2.0), 2)
            add(kind, node, f"{JOB_ID}:rank{rank}", t0, t1,
                f"rank {rank} ({node_id(node)}:gpu{gpu}) computes {factor}x slower", gpu=gpu, factor=factor)
    return sorted(windows, key=lambda w: w.start_ns)
