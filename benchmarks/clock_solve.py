"""Cost of clock sync's network solve on a 1,024-node fleet (one core). Prints one JSON object.

The probe graph is Huygens-like and sparse: every node probes ~10 peers (benchmarks/clock_sync_scenarios.py:
random Hamiltonian cycles topped up, so it is connected), 25 coded pairs/s per edge and direction, 50 %
load, hardware timestamps. Every 250 ms of simulated time the probes of that step go into one EdgeFitter
(all edges: the fitting cost of the whole fleet on one core), its ClockEdgeFit summaries into a
NetworkSolver, which then solves once. After a 2.5 s warm-up (the window fills and every edge becomes
valid), the median over the remaining steps is taken of:

- `clock_solve_ms_1024_nodes`: one NetworkSolver.update (reference choice, staleness, the two-pass
  network solve over every valid edge, publishing the estimates), the part that must see every edge;
- `fit_ms_1024_nodes`: one EdgeFitter.update over all edges (the part that splits over workers).

`max_offset_error_ns` (p99 over nodes at the last step, against the simulated truth) shows the solve is
doing real work. BLAS threads are pinned to 1. Usage: python benchmarks/clock_solve.py [--nodes N]
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_v] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from clock_sync_scenarios import ProbeTrace, Scenario  # noqa: E402

from clocktower.streams.clocksync.edge_fitter import EdgeFitter  # noqa: E402
from clocktower.streams.clocksync.network_solver import NetworkSolver  # noqa: E402

STEP_NS = 250_000_000
LAG_NS = 5_000_000
WARMUP_STEPS = 10
MEASURED_STEPS = 6


def measure(n_nodes: int = 1024, peers: int = 10, pairs_per_s: float = 25.0) -> dict[str, float]:
    sc = Scenario(f"solve{n_nodes}", load=0.5, nodes=n_nodes, peers=peers, pairs_per_s=pairs_per_s,
                  seconds=(WARMUP_STEPS + MEASURED_STEPS) * STEP_NS / 1e9)
    trace = ProbeTrace(sc)
    fitter, solver = EdgeFitter(), NetworkSolver()
    solve_s, fit_s = [], []
    est = []
    for k in range(1, WARMUP_STEPS + MEASURED_STEPS + 1):
        c = trace.chunk((k - 1) * STEP_NS - LAG_NS, k * STEP_NS - LAG_NS)
        now = int(trace.truth.local(0, k * STEP_NS))
        t0 = time.perf_counter()
        fitter.add_probes_arrays(c["sender"], c["receiver"], c["pair_id"], c["idx"], c["tx_ns"], c["rx_ns"],
                                 trace.names)
        fits = fitter.update(now)
        t1 = time.perf_counter()
        solver.add_fits(fits)
        t2 = time.perf_counter()
        est = solver.update(now)
        t3 = time.perf_counter()
        if k > WARMUP_STEPS:
            fit_s.append(t1 - t0)
            solve_s.append(t3 - t2)
    truth_t = WARMUP_STEPS + MEASURED_STEPS
    idx = np.array([trace.names.index(e.node) for e in est])
    off = np.array([e.offset_ns for e in est], dtype=np.float64)
    t_true = truth_t * STEP_NS
    true = trace.truth.offset(idx, t_true) - trace.truth.offset(0, t_true)
    return {"clock_solve_ms": 1e3 * float(np.median(solve_s)), "fit_ms": 1e3 * float(np.median(fit_s)),
            "edges": trace.edges, "valid_edges": solver.edges_valid, "nodes_estimated": len(est),
            "p99_offset_error_ns": float(np.percentile(np.abs(off - true), 99)) if est else float("nan")}


def clock_solve_ms(n_nodes: int = 1024) -> float:
    """Median wall time of one NetworkSolver.update on an `n_nodes` fleet, ms."""
    return measure(n_nodes)["clock_solve_ms"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1024)
    ap.add_argument("--quick", action="store_true", help="a smoke run: 64 nodes")
    args = ap.parse_args()
    n = 64 if args.quick else args.nodes
    t0 = time.perf_counter()
    m = measure(n)
    out = {f"clock_solve_ms_{n}_nodes": round(m["clock_solve_ms"], 1), "edges": m["edges"],
           f"fit_ms_{n}_nodes": round(m["fit_ms"], 1), "valid_edges": m["valid_edges"],
           "nodes_estimated": m["nodes_estimated"], "p99_offset_error_ns": round(m["p99_offset_error_ns"], 1),
           "wall_s": round(time.perf_counter() - t0, 1)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
