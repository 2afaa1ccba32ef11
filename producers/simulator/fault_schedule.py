"""The default fault schedule, scaled to the run, and queries on it.

Each fault is one `InjectedFault` ground-truth event (true-time start/end,
`node` = the faulty node) plus the parameters the producers need to act it
out. Targets are taken modulo the fleet size, so any fleet of two or more
nodes gets every fault. All times are true ns; node-N below is node N (named `node-N.demo`).

| kind        | when (D = duration)  | target                     | effect |
|-------------|----------------------|----------------------------|--------|
| link_flap   | 0.2 D, 6 transitions | node-1:eth0                | down/up x3, 0.3 s apart |
| congestion  | 0.35 D for 0.15 D    | node-2->node-3             | 50-500 µs queueing, slower comm |
| gpu_thermal | 0.45 D for 0.15 D    | node-0:gpu3                | 90-95 C, throttle 0x60, 1200 MHz, 1.3x |
| gpu_xid     | 0.6 D, permanent     | node-3:gpu5                | one reading with XID 79, then lost |
| gpu_ecc     | 0.7 D                | node-2:gpu1                | ecc_uncorrected 0 -> 1, XID 48 once |
| straggler   | 0.8 D for 0.1 D      | job-demo:rank9 (node-1:gpu1) | 1.5x compute |
"""

from __future__ import annotations

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
KINDS = ("link_flap", "congestion", "gpu_thermal", "gpu_xid", "gpu_ecc", "straggler")


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
    transitions: tuple[int, ...] = ()   # link_flap: true times of down, up, down, ...

    def active(self, t: int) -> bool:
        return self.start_ns <= t <= self.end_ns


class FaultSchedule:
    """The faults of one run, known up front."""

    def __init__(self, config: SimConfig, topo: Topology, start_ns: int) -> None:
        self.topo = topo
        self.windows: list[FaultWindow] = _default_windows(config, topo, start_ns) if config.faults else []
        self.faults: list[InjectedFault] = [w.fault for w in self.windows]
        self._flaps = {(w.node, w.interface): w.transitions for w in self.windows if w.kind == "link_flap"}
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

    def any_congested(self, t: int) -> bool:
        return any(w.active(t) for w in self._congested)

    # --- GPUs and ranks ----------------------------------------------------------------------

    def compute_factor(self, rank: int, t: int) -> float:
        """How much slower than normal a rank computes at `t` (thermal, straggler)."""
        f = 1.0
        for w in self._slow.get(rank, ()):
            if w.active(t):
                f *= w.factor
        return f

    def thermal(self, node: int, gpu: int, t: int) -> bool:
        w = self._thermal.get((node, gpu))
        return w is not None and w.active(t)

    def xid_window(self, node: int, gpu: int) -> FaultWindow | None:
        return self._xid.get((node, gpu))

    def ecc_window(self, node: int, gpu: int) -> FaultWindow | None:
        return self._ecc.get((node, gpu))


def _default_windows(config: SimConfig, topo: Topology, start_ns: int) -> list[FaultWindow]:
    d = config.duration_s
    n, g = topo.nodes, topo.gpus_per_node

    def at(frac: float) -> int:
        return start_ns + round(frac * d * S)

    windows: list[FaultWindow] = []

    def add(kind: str, node: int, target: str, start: int, end: int, detail: str, **kw: object) -> None:
        fault_id = f"{kind}-{len(windows) + 1}-{start_ns}"
        fault = InjectedFault(node=node_id(node), ts_ns=start, fault_id=fault_id, kind=kind,
                              target=target, start_ns=start, end_ns=end, detail=detail)
        windows.append(FaultWindow(fault=fault, kind=kind, node=node, start_ns=start, end_ns=end, **kw))

    # Six transitions 0.3 s apart (closer on very short runs, so the flap ends inside the run).
    spacing = round(min(FLAP_SPACING_S, 0.7 * d / (FLAP_TRANSITIONS - 1)) * S)
    t0 = at(0.2)
    flips = tuple(t0 + i * spacing for i in range(FLAP_TRANSITIONS))
    node = 1 % n
    add("link_flap", node, f"{node_id(node)}:{PRIMARY}", flips[0], flips[-1],
        f"{PRIMARY} down/up {FLAP_TRANSITIONS // 2} times, {spacing / 1e9:.2f} s apart, then stays up",
        interface=PRIMARY, transitions=flips)

    src, dst = 2 % n, 3 % n
    add("congestion", src, f"{node_id(src)}->{node_id(dst)}", at(0.35), at(0.50),
        "50-500 us of queueing on the link, all-reduce buckets slow down", peer=dst)

    node, gpu = 0, 3 % g
    add("gpu_thermal", node, f"{node_id(node)}:gpu{gpu}", at(0.45), at(0.60),
        f"90-95 C, throttle_reasons 0x{THERMAL_THROTTLE:x}, SM clock ~1200 MHz, "
        f"rank {topo.rank(node, gpu)} computes {THERMAL_SLOWDOWN}x slower",
        gpu=gpu, factor=THERMAL_SLOWDOWN)

    node, gpu = 3 % n, 5 % g
    add("gpu_xid", node, f"{node_id(node)}:gpu{gpu}", at(0.6), at(1.0),
        f"XID {XID_GPU_LOST}: GPU fell off the bus (permanent; end_ns is the end of the run)", gpu=gpu)

    node, gpu = 2 % n, 1 % g
    t = at(0.7)
    add("gpu_ecc", node, f"{node_id(node)}:gpu{gpu}", t, t,
        f"one uncorrectable ECC error (ecc_uncorrected 0 -> 1), XID {XID_ECC}", gpu=gpu)

    node, gpu = 1 % n, 1 % g
    rank = topo.rank(node, gpu)
    add("straggler", node, f"{JOB_ID}:rank{rank}", at(0.8), at(0.9),
        f"rank {rank} ({node_id(node)}:gpu{gpu}) computes {STRAGGLER_SLOWDOWN}x slower",
        gpu=gpu, factor=STRAGGLER_SLOWDOWN)
    return windows
