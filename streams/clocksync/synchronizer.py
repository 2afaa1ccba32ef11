"""Huygens-style clock synchronization in one process: probes in, per-node clock estimates out (pure logic).

    sync = ClockSynchronizer()             # reference: the lexicographically smallest node seen
    sync.add_probe(probe)                  # ClockProbe reports, any order, duplicates and losses allowed
    estimates = sync.update(now_ns)        # list[ClockEstimate], local = reference + offset
    sync.to_reference("node-7", local_ns)  # (reference_ns, error_bound_ns) or None (ClockCorrection)

A facade over the two levels a multi-worker deployment runs apart, composed through the same events:

    EdgeFitter (edge_fitter.py)     probes -> one ClockEdgeFit per edge       (per edge, any number of them)
    NetworkSolver (network_solver.py) ClockEdgeFits -> ClockEstimates          (one, sees every edge)
    ClockView (clock_view.py)       ClockEstimates -> to_reference             (one per consumer)

`now_ns` is the reference-clock time the probes fed so far reach up to (the newest rx_ns is a good
choice; any node's clock is within milliseconds of the reference). It anchors the sliding window, so a
consumer running seconds behind must pass probe time, not its own wall clock. Call `update` often: the
live error grows with the time since the last update (every 250 ms in the benchmark). Every update fits,
solves at now_ns and publishes; a node that has no estimate in the latest update converts to None.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from clocktower.schemas.analytics import ClockEstimate
from clocktower.schemas.telemetry import ClockProbe
from clocktower.streams.clocksync.clock_view import ClockView
from clocktower.streams.clocksync.edge_fitter import EdgeFitter
from clocktower.streams.clocksync.network_effect import NetworkSolution
from clocktower.streams.clocksync.network_solver import NetworkSolver
from clocktower.streams.clocksync.probe_filter import ProbePairFilter

NS = 1_000_000_000


class ClockSynchronizer:
    """Implements the ClockCorrection protocol of the flow-latency join."""

    def __init__(self, reference: str | None = None, window_ns: int = 2 * NS, *, pure_tolerance_ns: float = 100.0,
                 min_pairs: int = 8, min_span_ns: int = NS // 4, stale_ns: int | None = None,
                 step_threshold_ns: float = 100.0, bins: int = 8, history: int = 128, bound_sigmas: float = 5.0,
                 bound_floor_ns: float = 2.0, wander_ppb_per_s: float = 5.0,
                 curvature_sd: float | None = 5.0, recency_s: float | None = 1.5, holdover_ns: int = 10 * NS) -> None:
        self.fitter = EdgeFitter(window_ns, pure_tolerance_ns=pure_tolerance_ns, min_pairs=min_pairs,
                                 min_span_ns=min_span_ns, step_threshold_ns=step_threshold_ns, bins=bins,
                                 curvature_sd=curvature_sd, recency_s=recency_s)
        self.solver = NetworkSolver(reference, window_ns, stale_ns=stale_ns, bound_sigmas=bound_sigmas,
                                    bound_floor_ns=bound_floor_ns, holdover_ns=holdover_ns,
                                    wander_ppb_per_s=wander_ppb_per_s)
        self.view = ClockView(history=history, bound_sigmas=bound_sigmas, wander_ppb_per_s=wander_ppb_per_s)

    # --- input -------------------------------------------------------------------------------------------
    def add_probe(self, p: ClockProbe) -> None:
        self.fitter.add_probe(p)

    def add_probes(self, probes: Iterable[ClockProbe]) -> None:
        self.fitter.add_probes(probes)

    def add_probes_arrays(self, sender: np.ndarray, receiver: np.ndarray, pair_id: np.ndarray, idx: np.ndarray,
                          tx_ns: np.ndarray, rx_ns: np.ndarray, nodes: Sequence[str] | None = None) -> None:
        """Fast path: columns of probe reports. With `nodes`, sender/receiver index into it; else names."""
        self.fitter.add_probes_arrays(sender, receiver, pair_id, idx, tx_ns, rx_ns, nodes)

    # --- estimation ----------------------------------------------------------------------------------------
    def update(self, now_ns: int) -> list[ClockEstimate]:
        self.solver.add_fits(self.fitter.update(now_ns))
        estimates = self.solver.update(now_ns)
        if estimates:
            self.view.add_estimates(estimates)
        else:
            self.view.clear()            # no reference: nothing converts (the view alone cannot tell)
        return estimates

    @property
    def filter(self) -> ProbePairFilter:
        return self.fitter.filter

    @property
    def solution(self) -> NetworkSolution | None:
        return self.solver.solution

    @property
    def reference(self) -> str | None:
        return self.solver.reference

    @property
    def nodes(self) -> list[str]:
        """Nodes with a current estimate (the reference included)."""
        return self.view.nodes

    def to_reference(self, node: str, local_ns: int) -> tuple[int, int] | None:
        """`local_ns` on `node`'s clock converted to the reference clock, with an error bound (ns)."""
        return self.view.to_reference(node, local_ns)

    def estimate(self, node: str) -> ClockEstimate | None:
        """The latest estimate of `node`, as published."""
        return self.view.estimate(node)

    @property
    def stats(self) -> dict[str, float]:
        f, s = self.fitter.stats, self.solver.stats
        return {**{k: f[k] for k in ("probes", "duplicates", "replayed_pairs", "pairs", "pure_pairs",
                                     "expired_halves", "malformed", "edge_resets")},
                "edges_valid": s["edges_valid"], "loop_chi2": s["loop_chi2"],
                "edges_downweighted": s["edges_downweighted"]}
