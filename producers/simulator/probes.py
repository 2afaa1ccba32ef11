"""Huygens-style coded clock-probe pairs between nodes.

Nodes probe each other in both directions (the estimator needs both to
separate delay from offset): every node picks ceil(K/2) peers at random,
K = min(probe_peers, N-1), and each picked pair of nodes probes both ways, so
a node exchanges probes with about K peers (all of them when K = N-1).
`probe_pairs_per_s` pairs per second per direction, the two probes 1 µs apart
on the sender's clock. The receiver reports both probes
(tx_ns on the sender's clock, rx_ns and ts_ns on its own). True one-way
delay = 5 µs + small noise; now and then one probe of a pair is queued
behind other traffic, and on a congested link most probes are.
"""

from __future__ import annotations

import random
from math import log

from clocktower.producers.event_builder import EventBuilder
from clocktower.producers.simulator.config import SimConfig
from clocktower.producers.simulator.fault_schedule import FaultSchedule
from clocktower.producers.simulator.flows import Planned
from clocktower.producers.simulator.node_clock import NodeClock
from clocktower.producers.simulator.topology import Topology
from clocktower.schemas.telemetry import ClockProbe

BASE_DELAY_NS = 5_000
DELAY_NOISE_NS = 50.0
PAIR_GAP_NS = 1_000
QUEUED_PROBABILITY = 0.1
QUEUE_MEAN_NS = 8_000.0
CONGESTED_QUEUE_NS = (50_000, 500_000)


class ClockProber:
    """Plans the ClockProbe reports of every probe pair, one sending period at a time."""

    def __init__(self, config: SimConfig, topo: Topology, clocks: list[NodeClock], faults: FaultSchedule,
                 start_ns: int, rng: random.Random) -> None:
        self.topo = topo
        self.clocks = clocks
        self.faults = faults
        self.rng = rng
        self.period = round(1e9 / config.probe_pairs_per_s)
        self.start_ns = start_ns
        self.slot = 0
        k = min(config.probe_peers, topo.nodes - 1)
        edges: set[tuple[int, int]] = set()
        for s in range(topo.nodes):
            if k == topo.nodes - 1:
                peers = [n for n in range(topo.nodes) if n != s]
            elif topo.nodes <= 4 * k + 64:
                peers = rng.sample([n for n in range(topo.nodes) if n != s], (k + 1) // 2)
            else:
                peers = _sample_others(rng, topo.nodes, s, (k + 1) // 2)
            edges.update((min(s, p), max(s, p)) for p in peers)
        # (sender, receiver, phase within the period) for every probed direction.
        self.routes: list[tuple[int, int, int]] = []
        for a, b in sorted(edges):
            for s, p in ((a, b), (b, a)):
                self.routes.append((s, p, 1 + int(rng.random() * (self.period - 1))))
        self.peers: dict[str, list[str]] = {}
        for s, p, _ in self.routes:
            self.peers.setdefault(topo.node_ids[s], []).append(topo.node_ids[p])
        self._pair = (start_ns // 1_000_000_000) << 32   # unique across runs started in different seconds
        self._build = EventBuilder(ClockProbe)

    def plan(self, until: int, out: Planned) -> None:
        topo, clocks, rng, faults = self.topo, self.clocks, self.rng, self.faults
        rand = rng.random
        build = self._build
        while self.start_ns + self.slot * self.period <= until:
            base = self.start_ns + self.slot * self.period
            for s, r, phase in self.routes:
                t0 = base + phase
                congested = faults.congested(s, r, t0)
                d0 = BASE_DELAY_NS + rng.gauss(0.0, DELAY_NOISE_NS)
                d1 = BASE_DELAY_NS + rng.gauss(0.0, DELAY_NOISE_NS)
                if congested:
                    lo, hi = CONGESTED_QUEUE_NS
                    d0 += lo + rand() * (hi - lo)
                    d1 += lo + rand() * (hi - lo)
                elif rand() < QUEUED_PROBABILITY:
                    q = -QUEUE_MEAN_NS * log(1.0 - rand())
                    if rand() < 0.5:
                        d0 += q
                    else:
                        d1 += q
                tx0 = clocks[s].stamp(t0, rng)
                t1 = t0 + PAIR_GAP_NS
                a0, a1 = t0 + int(d0), t1 + int(d1)
                self._pair += 1
                sender, receiver = topo.node_ids[s], topo.node_ids[r]
                rx_clock = clocks[r]
                rx0, rx1 = rx_clock.stamp(a0, rng), rx_clock.stamp(a1, rng)
                out.append((a0, build(node=receiver, ts_ns=rx0, pair_id=self._pair, idx=0, sender=sender,
                                      receiver=receiver, tx_ns=tx0, rx_ns=rx0)))
                out.append((a1, build(node=receiver, ts_ns=rx1, pair_id=self._pair, idx=1, sender=sender,
                                      receiver=receiver, tx_ns=tx0 + PAIR_GAP_NS, rx_ns=rx1)))
            self.slot += 1


def _sample_others(rng: random.Random, n: int, me: int, k: int) -> list[int]:
    """k distinct nodes other than `me`, without listing all n (large fleets)."""
    chosen: set[int] = set()
    while len(chosen) < k:
        p = rng.randrange(n)
        if p != me:
            chosen.add(p)
    return sorted(chosen)
