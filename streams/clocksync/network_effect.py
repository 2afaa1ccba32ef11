"""Huygens' network effect: offsets around every loop of the probe graph must sum to zero.

Each edge (lo, hi) measures m = x_hi - x_lo (x: a node's clock minus the reference's) with variance v.
Edge errors are independent, so the best per-node values are the weighted least-squares solution
min sum (x_hi - x_lo - m)^2 / v with x_ref = 0: a weighted graph Laplacian with the reference's row and
column removed. Solving it spreads each loop's surplus back over its edges, weighted by their variances,
which removes most of the per-edge error when every node has ~10 peers. Drifts are solved the same way.
On the benchmark traces (64 nodes, ~10 peers) it cuts the node offset error about 3x against composing
the same edge fits along a fewest-hops tree: p99 1.8 vs 5.1 ns idle, 2.6 vs 7.8 ns at 50 % load,
6.4 vs 24 ns at 90 % load with bursts, 349 vs 1055 ns with software timestamps.

Edges that disagree with the rest (a fit corrupted by a queueing burst, a missed step) are down-weighted
by iterated Huber weights on their normalized residuals. When the loops disagree by more than the
stated variances allow (reduced chi-square > 1), the per-node covariance is inflated by it.

Only nodes in the reference's connected component get a value; a node that joins shows up once one of
its edges is valid, one that leaves drops out once its edges do (the caller decides edge validity).
Sparse iterative solves, one dense factorization per quantity for the variances (laplacian.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from clocktower.streams.clocksync import laplacian

HUBER_K = 3.0


@dataclass
class NetworkSolution:
    nodes: np.ndarray      # node indices with a value; the reference first
    offset: np.ndarray     # ns, x_node (0 for the reference)
    offset_std: np.ndarray
    drift: np.ndarray      # ppb
    drift_std: np.ndarray
    chi2: float            # reduced chi-square of the offset fit (loop consistency)
    edges: int             # edges used
    downweighted: int      # edges whose Huber weight dropped below 1/2

    def as_dict(self) -> dict[int, int]:
        return {int(n): i for i, n in enumerate(self.nodes)}


def component(n_nodes: int, lo: np.ndarray, hi: np.ndarray, root: int) -> np.ndarray:
    """Boolean mask of the nodes connected to `root`."""
    seen = np.zeros(n_nodes, dtype=bool)
    seen[root] = True
    while True:
        grow = seen[lo] ^ seen[hi]
        if not grow.any():
            return seen
        seen[lo[grow]] = True
        seen[hi[grow]] = True


def _wls(n: int, lo: np.ndarray, hi: np.ndarray, m: np.ndarray, var: np.ndarray, iterations: int,
         x0: np.ndarray | None, with_std: bool) -> tuple[np.ndarray, np.ndarray, float, np.ndarray]:
    """Solve on local indices 0..n-1 with node 0 the reference. Returns x, std (zeros unless `with_std`),
    chi2, Huber weights. `x0`: a starting guess (the previous solution), NaN where none."""
    h = np.ones(m.size)
    x = x0
    w = h / var
    chi2 = 0.0
    for _ in range(iterations):
        w = h / var
        rhs = np.bincount(hi, w * m, n) - np.bincount(lo, w * m, n)
        x = laplacian.solve(n, lo, hi, w, rhs, x)
        r = x[hi] - x[lo] - m
        z = np.abs(r) / np.sqrt(var)
        chi2 = float(np.sum(h * z * z) / max(m.size - (n - 1), 1))
        scale = max(chi2, 1.0) ** 0.5
        new_h = np.minimum(1.0, HUBER_K * scale / np.maximum(z, 1e-12))
        if np.allclose(new_h, h):
            break
        h = new_h
    assert x is not None
    std = np.zeros(n)
    if with_std:
        std[1:] = np.sqrt(np.clip(laplacian.inverse_diagonal(n, lo, hi, w), 0.0, None) * max(chi2, 1.0))
    return x, std, chi2, h


def solve_network(n_nodes: int, lo: np.ndarray, hi: np.ndarray, offset: np.ndarray, offset_var: np.ndarray,
                  drift: np.ndarray, drift_var: np.ndarray, reference: int, iterations: int = 4, *,
                  guess: tuple[np.ndarray, np.ndarray] | None = None, with_std: bool = True) -> NetworkSolution:
    """Per-node offsets (ns) and drifts (ppb) against `reference` from per-edge measurements of hi - lo.

    `guess`: (offset, drift) by node index to start the iterative solves from (any values give the same
    result, close ones fewer iterations). Without `with_std` the standard deviations are 0 (they cost a
    dense factorization; a pass that only refines the evaluation times does not need them)."""
    lo, hi = np.asarray(lo, dtype=np.int64), np.asarray(hi, dtype=np.int64)
    reach = component(n_nodes, lo, hi, reference) if lo.size else np.eye(1, n_nodes, reference, dtype=bool)[0]
    nodes = np.r_[reference, np.flatnonzero(reach & (np.arange(n_nodes) != reference))]
    n = nodes.size
    if n == 1:
        z = np.zeros(1)
        return NetworkSolution(nodes, z, z.copy(), z.copy(), z.copy(), 0.0, 0, 0)
    local = np.full(n_nodes, -1)
    local[nodes] = np.arange(n)
    use = reach[lo] & reach[hi]
    a, b = local[lo[use]], local[hi[use]]
    x0, d0 = (None, None) if guess is None else (np.asarray(guess[0])[nodes], np.asarray(guess[1])[nodes])
    x, xs, chi2, h = _wls(n, a, b, offset[use], offset_var[use], iterations, x0, with_std)
    dr, ds, _, _ = _wls(n, a, b, drift[use], drift_var[use], iterations, d0, with_std)
    return NetworkSolution(nodes=nodes, offset=x, offset_std=xs, drift=dr, drift_std=ds, chi2=chi2,
                           edges=int(use.sum()), downweighted=int(np.sum(h < 0.5)))
