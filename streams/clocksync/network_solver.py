"""Level 2 of clock sync: per-edge fits in, per-node clock estimates out (pure logic).

    solver = NetworkSolver()               # reference: the smallest node name seen
    if solver.add_fits(fits):              # ClockEdgeFit summaries from any number of EdgeFitters
        estimates = solver.update(solver.latest_origin_ns)   # list[ClockEstimate], local = reference + offset

It keeps the latest summary of every edge. `update(now_ns)` reads every edge at the instant the reference
clock reads now_ns, i.e. at lo-local time now + x_lo: a summary made at origin ts_ns is read at
t = (now - ts_ns) / 1e9 + x_lo / 1e9 s of its fit, so a summary older than now is extrapolated along its
fitted curve (and its sample times age with it). Then:

- Presence: a node is present while one of its edges has a sample within `window_ns` before now (what the
  fitter's window holds). Edges with none are forgotten.
- Reference: the given one (no estimates while it is absent) or else the smallest present node name, kept
  while it stays (a newcomer with a smaller name does not rebase everyone).
- Usable edges: valid fits with a sample in each direction within `stale_ns` before now; so a node that
  leaves drops out after `stale_ns`, and one that joins comes in once an edge of it has a valid fit.
- `solve_network` spreads the loop surpluses over the edges (weighted least squares) and yields every
  reachable node's offset and drift against the reference with standard deviations. x comes from the
  previous solve and is refined in a second pass (a 1 ms error times a 60 ppm relative drift would
  otherwise cost 60 ns). Nodes outside the reference's component get no estimate.

When to solve, with several fitters publishing at their own times: `update` always solves when called;
`add_fits` says when it is due, namely when a fit arrives whose origin is at least `solve_every_ns` newer
than the last solve's now. With fitters updating every 250 ms of probe time, the first summary of each
round triggers a solve at that round's origin, and summaries of that round that arrive later are used by
the next solve (extrapolated there, which costs little: the live conversions extrapolate as far).

The error bound of an estimate is `bound_sigmas` standard deviations (inflated by the loop misfit) plus
`bound_floor_ns`; ClockView (clock_view.py) grows it with the time a conversion is away from the estimate.

Hold-over (issue 20): when every probe into a node is queued, none of its edges has a fresh pure pair, so the
solve cannot reach it. Its last solved estimate is then carried forward along its drift for up to `holdover_ns`
(10 s), its bound widened as ClockView widens a conversion's (drift uncertainty, plus a wander allowance),
and published with `held_ns` = how long ago it was solved; the node is not dropped. Past that (a node that left),
it is. Held estimates count in the solve's `solve_nodes`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from clocktower.schemas.analytics import ClockEdgeFit, ClockEstimate
from clocktower.streams.clocksync.fit_table import FitTable
from clocktower.streams.clocksync.network_effect import NetworkSolution, solve_network

NS = 1_000_000_000


class NetworkSolver:
    def __init__(self, reference: str | None = None, window_ns: int = 2 * NS, *, stale_ns: int | None = None,
                 bound_sigmas: float = 5.0, bound_floor_ns: float = 2.0, solve_every_ns: int = NS // 8,
                 holdover_ns: int = 10 * NS, wander_ppb_per_s: float = 5.0) -> None:
        self.fixed_reference = reference
        self.window_ns = int(window_ns)
        self.stale_ns = int(stale_ns if stale_ns is not None else window_ns // 2)
        self.bound_sigmas = bound_sigmas
        self.bound_floor_ns = bound_floor_ns
        self.solve_every_ns = int(solve_every_ns)
        self.holdover_ns = int(holdover_ns)
        self.wander_ppb_per_s = wander_ppb_per_s
        self._solved: dict[str, ClockEstimate] = {}   # each node's last estimate the solve made (for hold-over)
        self.table = FitTable()
        self._x = np.zeros(0)          # last offsets per node index (ns), 0 where unknown
        self._dr = np.zeros(0)         # last drifts per node index (ppb)
        self._reference: str | None = reference
        self._reference_since: int | None = None   # when the current reference was chosen (its warm-up)
        self.solution: NetworkSolution | None = None
        self.latest_origin_ns = 0      # newest fit origin added
        self.last_solve_ns: int | None = None
        self.edges_valid = 0           # edges used by the last solve (valid and fresh)

    @property
    def reference(self) -> str | None:
        return self._reference

    def add_fits(self, fits: Iterable[ClockEdgeFit]) -> bool:
        """Keep the latest fit per edge. True when a solve is due (see the module doc)."""
        newest = self.table.add(fits)
        self.latest_origin_ns = max(self.latest_origin_ns, newest)
        last = self.last_solve_ns
        return newest > 0 and (last is None or newest >= last + self.solve_every_ns)

    def update(self, now_ns: int) -> list[ClockEstimate]:
        """Solve at `now_ns` (reference-clock ns) from the fits kept; the estimates of every reachable node."""
        now_ns = int(now_ns)
        self.last_solve_ns = now_ns
        tab = self.table
        tab.flush()
        age = (tab.origin - now_ns) / NS                        # origin relative to now, s (<= 0 when older)
        fits = tab.pair_fits()
        last = np.maximum(fits.t_last_fwd, fits.t_last_rev) + age
        tab.keep(last >= -self.window_ns / NS)
        age = (tab.origin - now_ns) / NS
        fits = tab.pair_fits()
        n_nodes = len(tab.names)
        self._x = np.r_[self._x, np.zeros(n_nodes - self._x.size)]
        self._dr = np.r_[self._dr, np.zeros(n_nodes - self._dr.size)]
        stale = self.stale_ns / NS
        usable = fits.valid & (fits.t_last_fwd + age >= -stale) & (fits.t_last_rev + age >= -stale)
        self.edges_valid = int(usable.sum())
        present = np.zeros(n_nodes, dtype=bool)
        present[tab.lo] = present[tab.hi] = True
        ref = self._pick_reference(present, now_ns)
        if ref is None:
            self.solution = None
            return []
        sel = np.flatnonzero(usable)
        lo, hi = tab.lo[sel], tab.hi[sel]
        sol = None
        for final in (False, True):
            t_eval = -age[sel] + self._x[lo] / NS       # lo-local time when the reference reads now, s of the fit
            m, var = fits.offset(sel, t_eval)
            drift, drift_var = fits.drift(sel, t_eval)
            drift = drift * (1.0 + self._dr[lo] * 1e-9)   # per reference second, not per lo-local second
            sol = solve_network(n_nodes, lo, hi, m, np.maximum(var, 1e-2), drift, np.maximum(drift_var, 1e-4),
                                tab.node(ref), guess=(self._x, self._dr), with_std=final)
            self._x = np.zeros(n_nodes)
            self._dr = np.zeros(n_nodes)
            self._x[sol.nodes], self._dr[sol.nodes] = sol.offset, sol.drift
        assert sol is not None
        self.solution = sol
        out = self._publish(sol, ref, now_ns)
        self._solved.update((e.node, e) for e in out)
        out += self._held_over({e.node for e in out}, ref, now_ns)
        return [e.model_copy(update={"solve_nodes": len(out)}) for e in out]

    def _held_over(self, solved: set[str], ref: str, now_ns: int) -> list[ClockEstimate]:
        """The last estimates of the nodes this solve did not reach, carried forward to now (module doc)."""
        out = []
        for node, last in list(self._solved.items()):
            dt_ns = now_ns - last.ts_ns
            if last.reference != ref or dt_ns > self.holdover_ns:
                del self._solved[node]   # another reference's offsets, or gone too long
                continue
            if node in solved:
                continue
            dt = dt_ns / NS
            offset = last.offset_ns + last.offset_frac_ns + last.drift_ppb * dt
            bound = (last.error_bound_ns + self.bound_sigmas * last.drift_std_ppb * dt
                     + 0.5 * self.wander_ppb_per_s * dt * dt)
            out.append(last.model_copy(update={
                "ts_ns": now_ns, "offset_ns": round(offset), "offset_frac_ns": offset - round(offset),
                "error_bound_ns": math.ceil(bound), "held_ns": dt_ns}))
        return out

    def _pick_reference(self, present: np.ndarray, now_ns: int) -> str | None:
        names = self.table.names
        if self.fixed_reference is not None:
            i = self.table.index_of(self.fixed_reference)
            return self.fixed_reference if i is not None and present[i] else None
        cur = self._reference
        live = [names[i] for i in np.flatnonzero(present)]
        warming = self._reference_since is not None and now_ns - self._reference_since < self.window_ns
        if cur is not None and present[self.table.node(cur)] and not (warming and min(live) < cur):
            return cur
        # The smallest node id; kept while it stays, except in its first window: fits from several workers come
        # in one edge at a time at first, and the smallest node's edges may simply not be in yet.
        self._reference = min(live) if live else None
        if self._reference != cur:
            self._reference_since = now_ns
        return self._reference

    def _publish(self, sol: NetworkSolution, ref: str, now_ns: int) -> list[ClockEstimate]:
        names = self.table.names
        out = []
        for i, node in enumerate(sol.nodes.tolist()):
            is_ref = i == 0
            bound = 0.0 if is_ref else self.bound_sigmas * float(sol.offset_std[i]) + self.bound_floor_ns
            offset = float(sol.offset[i])
            out.append(ClockEstimate(node=names[node], ts_ns=now_ns, reference=ref, offset_ns=round(offset),
                                     offset_frac_ns=offset - round(offset), drift_ppb=float(sol.drift[i]),
                                     error_bound_ns=math.ceil(bound),
                                     drift_std_ppb=0.0 if is_ref else float(sol.drift_std[i]),
                                     solve_nodes=int(sol.nodes.size)))
        return out

    @property
    def stats(self) -> dict[str, float]:
        sol = self.solution
        return {"edges_kept": len(self.table), "edges_valid": self.edges_valid,
                "loop_chi2": sol.chi2 if sol else 0.0, "edges_downweighted": sol.downweighted if sol else 0}
