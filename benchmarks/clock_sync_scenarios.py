"""Vectorized probe traces with ground truth for the clock-sync benchmark (numpy only).

Model (all times are float64 ns of simulated *true* time since the start, stamps are int64 epoch ns):

- Clocks: node i reads `true + theta_i(true)`. theta_i(0) is uniform in ±`max_offset_ns`; the drift starts
  uniform in ±`max_drift_ppm` and wanders as a random walk (a temperature walk: Gaussian steps of
  `wander_ppb` per 1 s knot, reflected inside ±max_drift). The drift is linear between knots and the offset
  is its integral, so both are continuous (node_clock.py models the same thing, one stamp at a time).
- Probe graph: the union of peers/2 random Hamiltonian cycles, topped up with random edges, so every node
  has about `peers` peers and the graph is connected. Every edge is probed both ways: `pairs_per_s`
  exchanges per second, each a coded pair (two probes `spacing_ns` apart) from the initiator (alternating
  ends) answered by a pair from the other end 20 µs after the second probe lands. So every node sends
  `peers * pairs_per_s` pairs/s, and the fleet `nodes * peers * pairs_per_s`.
- One-way delay = the edge's base delay (2-6 µs, the same both ways unless `asymmetry_ns`: then one
  direction is longer by up to that and the other shorter, which no probing method can observe)
  + fabric jitter (exponential, mean `jitter_ns`) + queueing at one bottleneck hop per direction, an
  M/M/1 queue at utilisation `load` with exponential service of mean `service_ns`: probe 0 waits 0 with
  probability 1-load, else Exp(service / (1-load)); probe 1 follows Lindley's recursion
  W1 = max(0, W0 + X - spacing), X the work that arrived in between (compound Poisson). So a pair
  touched by a queue usually arrives with a changed spacing. Burst episodes (Poisson, `bursts_per_s` per
  directed link, Exp(`burst_ms`) long) add a standing queue of 10-100 µs at utilisation 0.98 to every
  probe they cover.
- Timestamps: every tx and rx stamp gets Gaussian noise of `noise_ns` (hardware NIC stamps ~8 ns,
  software stamps ~1.5 µs).

`ProbeTrace.chunk(t0, t1)` returns the probes of the exchanges initiated in [t0, t1), columns as the
synchronizer's array fast path takes them, plus per-exchange first-probe columns for the NTP baseline.
`ProbeTrace.truth` answers the ground truth at any true time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

EPOCH_NS = 1_780_000_000 * 10**9
KNOT_NS = 1e9
NOISE_NS = {"hardware": 8.0, "software": 1500.0}
RESPONSE_NS = 20_000.0


@dataclass(frozen=True)
class Scenario:
    name: str
    load: float = 0.01
    bursts_per_s: float = 0.0
    noise: str = "hardware"
    nodes: int = 64
    peers: int = 10
    pairs_per_s: float = 100.0
    seconds: float = 60.0
    spacing_ns: float = 1_000.0
    service_ns: float = 1_000.0
    jitter_ns: float = 5.0
    asymmetry_ns: float = 0.0
    burst_ms: float = 30.0
    max_offset_ns: float = 1e6
    max_drift_ppm: float = 30.0
    wander_ppb: float = 5.0
    seed: int = 1

    @property
    def noise_ns(self) -> float:
        return NOISE_NS[self.noise]


SCENARIOS = {
    "idle": Scenario("idle", load=0.01),
    "load50": Scenario("load50", load=0.5, bursts_per_s=0.1),
    "load90_bursts": Scenario("load90_bursts", load=0.9, bursts_per_s=1.0),
    "load50_software": Scenario("load50_software", load=0.5, bursts_per_s=0.1, noise="software"),
    "load50_asym20": Scenario("load50_asym20", load=0.5, bursts_per_s=0.1, asymmetry_ns=20.0),
}


class ClockTruth:
    """The true offset theta_i(t) = local_i - true of every node, vectorized over (node, t)."""

    def __init__(self, rng: np.random.Generator, nodes: int, seconds: float, max_offset_ns: float,
                 max_drift_ppm: float, wander_ppb: float) -> None:
        knots = int(seconds) + 3
        lim = max_drift_ppm * 1e-6
        drift = np.empty((nodes, knots))
        drift[:, 0] = rng.uniform(-lim, lim, nodes)
        steps = rng.normal(0.0, wander_ppb * 1e-9, (nodes, knots - 1))
        for k in range(1, knots):
            d = drift[:, k - 1] + steps[:, k - 1]
            d = np.where(d > lim, 2 * lim - d, d)
            drift[:, k] = np.where(d < -lim, -2 * lim - d, d)
        cum = np.empty((nodes, knots))
        cum[:, 0] = rng.uniform(-max_offset_ns, max_offset_ns, nodes)
        cum[:, 1:] = cum[:, :1] + np.cumsum(0.5 * (drift[:, :-1] + drift[:, 1:]) * KNOT_NS, axis=1)
        self.drift, self.cum, self.knots = drift, cum, knots

    def offset(self, node: np.ndarray | int, t: np.ndarray | float) -> np.ndarray:
        """theta (ns, float) of `node` at true time `t` (ns since start)."""
        t = np.asarray(t, dtype=np.float64)
        k = np.clip((t // KNOT_NS).astype(np.int64), 0, self.knots - 2)
        x = t - k * KNOT_NS
        d0 = self.drift[node, k]
        return self.cum[node, k] + d0 * x + (self.drift[node, k + 1] - d0) * x * x / (2 * KNOT_NS)

    def drift_ppb(self, node: np.ndarray | int, t: np.ndarray | float) -> np.ndarray:
        t = np.asarray(t, dtype=np.float64)
        k = np.clip((t // KNOT_NS).astype(np.int64), 0, self.knots - 2)
        x = (t - k * KNOT_NS) / KNOT_NS
        return (self.drift[node, k] * (1 - x) + self.drift[node, k + 1] * x) * 1e9

    def local(self, node: np.ndarray | int, t: np.ndarray | float) -> np.ndarray:
        """The noiseless epoch-ns reading of `node`'s clock at true time `t`."""
        t = np.asarray(t, dtype=np.float64)
        return EPOCH_NS + np.rint(t + self.offset(node, t)).astype(np.int64)


def probe_graph(rng: np.random.Generator, nodes: int, peers: int) -> tuple[np.ndarray, np.ndarray]:
    """Edges (lo, hi), lo < hi: random Hamiltonian cycles topped up with random edges, ~`peers` peers per node."""
    peers = min(peers, nodes - 1)
    edges: set[tuple[int, int]] = set()
    for _ in range(peers // 2):
        perm = rng.permutation(nodes)
        for a, b in zip(perm, np.roll(perm, -1), strict=True):
            edges.add((min(a, b), max(a, b)))
    # Top up (cycles overlap now and then) with random edges between nodes still short of peers.
    degree = np.zeros(nodes, dtype=np.int64)
    for a, b in edges:
        degree[a] += 1
        degree[b] += 1
    for _ in range(50 * nodes):
        short = np.flatnonzero(degree < peers)
        if short.size < 2:
            break
        a, b = rng.choice(short, 2, replace=False)
        e = (min(a, b), max(a, b))
        if e not in edges:
            edges.add(e)
            degree[a] += 1
            degree[b] += 1
    arr = np.array(sorted(edges), dtype=np.int64)
    return arr[:, 0], arr[:, 1]


class ProbeTrace:
    """Generates the coded probe pairs of a scenario, chunk by chunk, and keeps the ground truth."""

    def __init__(self, sc: Scenario) -> None:
        self.sc = sc
        rng = np.random.default_rng(sc.seed)
        self.rng = rng
        self.names = [f"n{i:03d}" for i in range(sc.nodes)]
        self.truth = ClockTruth(rng, sc.nodes, sc.seconds + 2, sc.max_offset_ns, sc.max_drift_ppm, sc.wander_ppb)
        self.lo, self.hi = probe_graph(rng, sc.nodes, sc.peers)
        e = len(self.lo)
        self.base_ns = rng.uniform(2_000.0, 6_000.0, e)
        self.asym_ns = rng.uniform(-sc.asymmetry_ns, sc.asymmetry_ns, e)    # lo->hi longer by this, hi->lo shorter
        self.period_ns = 1e9 / sc.pairs_per_s
        self.phase_ns = rng.uniform(0.0, self.period_ns, e)
        # Burst episodes per directed link (2e: lo->hi then hi->lo), as sorted keys link * H + time.
        horizon = (sc.seconds + 2) * 1e9
        self._h = horizon
        n_b = rng.poisson(sc.bursts_per_s * (sc.seconds + 2), 2 * e)
        link = np.repeat(np.arange(2 * e), n_b)
        start = rng.uniform(0.0, horizon, link.size)
        order = np.lexsort((start, link))
        link, start = link[order], start[order]
        self._b_key = link * horizon + start
        self._b_end = start + rng.exponential(sc.burst_ms * 1e6, link.size)
        self._b_level = rng.uniform(10_000.0, 100_000.0, link.size)
        self._b_link = link

    @property
    def edges(self) -> int:
        return len(self.lo)

    def _burst(self, link: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Standing-queue level (ns) of each directed link at true time t; 0 outside a burst."""
        if self._b_key.size == 0:
            return np.zeros(t.shape)
        i = np.searchsorted(self._b_key, link * self._h + t, side="right") - 1
        ok = i >= 0
        j = np.where(ok, i, 0)
        inside = ok & (self._b_link[j] == link) & (t < self._b_end[j])
        return np.where(inside, self._b_level[j], 0.0)

    def _queue(self, link: np.ndarray, t0: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Queueing delays of the two probes of pairs sent at t0 (probe 1 `spacing` later)."""
        sc, rng = self.sc, self.rng
        n = t0.size
        level = self._burst(link, t0)
        rho = np.where(level > 0, 0.98, sc.load)
        busy = (level > 0) | (rng.random(n) < rho)
        w0 = level + np.where(busy, rng.exponential(1.0, n) * sc.service_ns / (1.0 - rho), 0.0)
        arrivals = rng.poisson(rho * sc.spacing_ns / sc.service_ns)
        work = np.where(arrivals > 0, rng.gamma(np.maximum(arrivals, 1), sc.service_ns), 0.0)
        w1 = np.maximum(0.0, w0 + work - sc.spacing_ns)
        return w0, w1

    def chunk(self, t0: float, t1: float) -> dict[str, np.ndarray]:
        """Probes of the exchanges initiated in true time [t0, t1)."""
        sc, rng, truth = self.sc, self.rng, self.truth
        p = self.period_ns
        j0 = np.ceil((t0 - self.phase_ns) / p).astype(np.int64)
        j1 = np.ceil((t1 - self.phase_ns) / p).astype(np.int64)
        cnt = np.maximum(j1 - j0, 0)
        edge = np.repeat(np.arange(self.edges), cnt)
        j = np.repeat(j0, cnt) + (np.arange(cnt.sum()) - np.repeat(np.cumsum(cnt) - cnt, cnt))
        keep = j >= 0
        edge, j = edge[keep], j[keep]
        n = edge.size
        ts = self.phase_ns[edge] + j * p + rng.uniform(-0.1, 0.1, n) * p
        lo, hi = self.lo[edge], self.hi[edge]
        lo_first = (j % 2) == 0
        a = np.where(lo_first, lo, hi)       # initiator
        b = np.where(lo_first, hi, lo)
        link_ab = np.where(lo_first, edge, edge + self.edges)
        link_ba = np.where(lo_first, edge + self.edges, edge)
        base_ab = self.base_ns[edge] + np.where(lo_first, 1.0, -1.0) * self.asym_ns[edge]
        base_ba = 2 * self.base_ns[edge] - base_ab
        s = sc.spacing_ns
        # initiator -> responder
        q0, q1 = self._queue(link_ab, ts)
        arr0 = ts + base_ab + q0 + rng.exponential(sc.jitter_ns, n)
        arr1 = ts + s + base_ab + q1 + rng.exponential(sc.jitter_ns, n)
        # responder -> initiator, after the second probe landed
        tr = np.maximum(arr0, arr1) + RESPONSE_NS
        r0, r1 = self._queue(link_ba, tr)
        brr0 = tr + base_ba + r0 + rng.exponential(sc.jitter_ns, n)
        brr1 = tr + s + base_ba + r1 + rng.exponential(sc.jitter_ns, n)
        sig = sc.noise_ns

        def stamp(node: np.ndarray, t: np.ndarray) -> np.ndarray:
            return EPOCH_NS + np.rint(t + truth.offset(node, t) + rng.normal(0.0, sig, t.size)).astype(np.int64)

        gid = (edge.astype(np.uint64) << np.uint64(32)) + j.astype(np.uint64)
        sender = np.concatenate([a, a, b, b])
        receiver = np.concatenate([b, b, a, a])
        pair_id = np.concatenate([2 * gid, 2 * gid, 2 * gid + 1, 2 * gid + 1])
        idx = np.repeat(np.array([0, 1, 0, 1], dtype=np.int8), n)
        tx = np.concatenate([stamp(a, ts), stamp(a, ts + s), stamp(b, tr), stamp(b, tr + s)])
        rx = np.concatenate([stamp(b, arr0), stamp(b, arr1), stamp(a, brr0), stamp(a, brr1)])
        # For the NTP baseline: first probe of each direction, oriented lo->hi ("fwd") and hi->lo ("rev").
        n4 = np.arange(n)
        fwd_row = np.where(lo_first, n4, 2 * n + n4)
        rev_row = np.where(lo_first, 2 * n + n4, n4)
        return {
            "sender": sender, "receiver": receiver, "pair_id": pair_id, "idx": idx, "tx_ns": tx, "rx_ns": rx,
            "x_edge": edge, "x_fwd_tx": tx[fwd_row], "x_fwd_rx": rx[fwd_row],
            "x_rev_tx": tx[rev_row], "x_rev_rx": rx[rev_row],
        }
