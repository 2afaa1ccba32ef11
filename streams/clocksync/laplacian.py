"""Weighted graph-Laplacian systems with one node grounded (node 0), in numpy only.

The network solve (network_effect.py) needs, per Huber iteration, x from L x = rhs, and once at the
end the diagonal of L^-1 (the per-node variances). A probe graph is sparse (~10 peers per node), so
the solves are preconditioned conjugate gradients whose matrix-vector product costs one pass over the
edges, warm-started from the previous solution; only the variances need the dense matrix, once per
quantity and solve, via its Cholesky factor. On 1,024 nodes that cuts a solve from ~1 s (a dense
inverse per iteration) to about a tenth (benchmarks/clock_solve.py).
"""

from __future__ import annotations

import numpy as np

CG_TOL = 1e-12          # relative residual: far below any offset's noise
CG_MAX_ITER = 1_000
_BLOCK = 96


def _matvec(n: int, lo: np.ndarray, hi: np.ndarray, w: np.ndarray, x: np.ndarray) -> np.ndarray:
    d = w * (x[hi] - x[lo])
    return np.bincount(hi, d, n) - np.bincount(lo, d, n)


def dense(n: int, lo: np.ndarray, hi: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The Laplacian with node 0's row and column removed, as a dense (n-1, n-1) matrix."""
    lap = np.zeros((n, n))
    np.add.at(lap, (lo, lo), w)
    np.add.at(lap, (hi, hi), w)
    np.add.at(lap, (lo, hi), -w)
    np.add.at(lap, (hi, lo), -w)
    return lap[1:, 1:]


def solve(n: int, lo: np.ndarray, hi: np.ndarray, w: np.ndarray, rhs: np.ndarray,
          x0: np.ndarray | None = None) -> np.ndarray:
    """x (x[0] = 0) with (L x)[1:] = rhs[1:], by Jacobi-preconditioned CG; dense if CG stalls."""
    diag = (np.bincount(lo, w, n) + np.bincount(hi, w, n))[1:]
    b = rhs[1:]
    x = np.zeros(n) if x0 is None else np.where(np.isfinite(x0), x0, 0.0)
    x[0] = 0.0
    r = b - _matvec(n, lo, hi, w, x)[1:]
    stop = CG_TOL * max(float(np.linalg.norm(b)), 1e-300)
    z = r / diag
    p = z.copy()
    rz = float(r @ z)
    full = np.zeros(n)
    for _ in range(CG_MAX_ITER):
        if float(np.linalg.norm(r)) <= stop:
            return x
        full[1:] = p
        ap = _matvec(n, lo, hi, w, full)[1:]
        alpha = rz / float(p @ ap)
        x[1:] += alpha * p
        r -= alpha * ap
        z = r / diag
        rz_new = float(r @ z)
        p = z + (rz_new / rz) * p
        rz = rz_new
    return np.r_[0.0, np.linalg.solve(dense(n, lo, hi, w), b)]


def _tri_inv(low: np.ndarray) -> np.ndarray:
    """Inverse of a lower-triangular matrix, by halves (matrix products do the work)."""
    n = low.shape[0]
    if n <= _BLOCK:
        return np.linalg.inv(low)
    k = n // 2
    a, d = _tri_inv(low[:k, :k]), _tri_inv(low[k:, k:])
    out = np.zeros_like(low)
    out[:k, :k], out[k:, k:] = a, d
    out[k:, :k] = -(d @ low[k:, :k]) @ a
    return out


def inverse_diagonal(n: int, lo: np.ndarray, hi: np.ndarray, w: np.ndarray) -> np.ndarray:
    """diag(L_red^-1) (length n-1): with L_red = C C', L_red^-1 = C^-T C^-1, so entry i is column i of
    C^-1 squared and summed."""
    ci = _tri_inv(np.linalg.cholesky(dense(n, lo, hi, w)))
    return np.einsum("ij,ij->j", ci, ci)
