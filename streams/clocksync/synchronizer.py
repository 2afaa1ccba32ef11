"""Huygens-style clock synchronization: probes in, per-node clock estimates out (pure logic).

    sync = ClockSynchronizer()             # reference: the lexicographically smallest node seen
    sync.add_probe(probe)                  # ClockProbe reports, any order, duplicates and losses allowed
    estimates = sync.update(now_ns)        # list[ClockEstimate], local = reference + offset
    sync.to_reference("node-7", local_ns)  # (reference_ns, error_bound_ns) or None (ClockCorrection)

`now_ns` is the reference-clock time the probes fed so far reach up to (the newest rx_ns is a good
choice; any node's clock is within milliseconds of the reference). It anchors the sliding window, so a
consumer running seconds behind must pass probe time, not its own wall clock. Call `update` often: the
live error grows with the time since the last update (every 250 ms in the benchmark).

Each update:

1. `ProbePairFilter` matches the pairs reported since the last update and keeps the pure ones; a pair
   replayed after it was matched is dropped by its (sender, pair_id).
2. Each pure pair becomes one sample of its edge (lo, hi): its mean time on lo's clock and its mean
   one-way "delay + offset". Samples older than `window_ns` are dropped.
3. Clock steps: a new sample far *below* its edge's previous floor (queueing only adds delay; "far" is
   max(`step_threshold_ns`, 12 sigma)) means one of the two clocks stepped (or the path got shorter).
   Two such samples reset the edge: its older samples are dropped, so it refits from post-step data and
   the stepped node is back within about `min_span_ns` plus an update, instead of carrying a blend for a
   whole window. Smaller steps are absorbed like drift and age out of the window.
4. `fit_pairs` fits every edge (both directions, floor core; see pair_fit.py). Edges with too few core
   samples, too short a span, or no fresh sample in a direction for `stale_ns` are left out; so a node
   that leaves drops out after `stale_ns` and one that joins comes in once its edges have `min_span_ns`
   of data.
5. `solve_network` spreads the loop surpluses over the edges (weighted least squares) and yields every
   reachable node's offset and drift against the reference with standard deviations. Edges are read at
   the instant the reference clock reads now_ns, i.e. at lo-local time now + x_lo; x comes from the
   previous update and is refined in a second pass (a 1 ms error times a 60 ppm relative drift would
   otherwise cost 60 ns). Nodes outside the reference's component get no estimate.

The reference is the given one (no estimates while it is absent) or else the smallest node id with
samples in the window, kept while it stays (a newcomer with a smaller id does not rebase everyone).

The error bound of an estimate is `bound_sigmas` standard deviations (inflated by the loop misfit) plus
`bound_floor_ns`; `to_reference` adds the drift uncertainty and a drift-wander allowance for the time
between the estimate and the timestamp converted. Timestamps from the past are converted with the first
estimate made after them (its fit window covered them); newer ones with the latest. A node that has no
estimate in the latest update (left, stepped, cut off) converts to None.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from clocktower.schemas.analytics import ClockEstimate
from clocktower.schemas.telemetry import ClockProbe
from clocktower.streams.clocksync.network_effect import NetworkSolution, solve_network
from clocktower.streams.clocksync.pair_fit import PairFits, fit_pairs, floor_drops
from clocktower.streams.clocksync.probe_filter import ProbePairFilter, PurePairs

NS = 1_000_000_000
_BUF_LIMIT = 100_000           # probes buffered by add_probe before they are handed to the filter
_STORE = ("edge", "fwd", "tau", "y", "sender", "pair_id")
_STORE_DT = (np.int64, bool, np.int64, np.float64, np.int64, np.uint64)


@dataclass(frozen=True)
class _Entry:
    ts_ns: int
    offset_ns: float
    drift_ppb: float
    bound_ns: float
    drift_std_ppb: float


def _empty_store() -> dict[str, np.ndarray]:
    return {c: np.empty(0, dtype=d) for c, d in zip(_STORE, _STORE_DT, strict=True)}


class _EdgeRegistry:
    """Stable small integer ids for node pairs (lo < hi), so per-edge state is plain array rows."""

    def __init__(self) -> None:
        self.keys = np.empty(0, dtype=np.int64)      # sorted lo << 32 | hi
        self.ids = np.empty(0, dtype=np.int64)       # id of each sorted key
        self.lo = np.empty(0, dtype=np.int64)        # by id
        self.hi = np.empty(0, dtype=np.int64)

    def __len__(self) -> int:
        return int(self.lo.size)

    def ids_of(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        keys = (lo << 32) | hi
        uk, inv = np.unique(keys, return_inverse=True)
        pos = np.searchsorted(self.keys, uk)
        found = pos < self.keys.size
        found[found] = self.keys[pos[found]] == uk[found]
        fresh = uk[~found]
        if fresh.size:
            new_ids = np.arange(len(self), len(self) + fresh.size)
            self.lo, self.hi = np.r_[self.lo, fresh >> 32], np.r_[self.hi, fresh & 0xFFFFFFFF]
            keys_all, ids_all = np.r_[self.keys, fresh], np.r_[self.ids, new_ids]
            order = np.argsort(keys_all, kind="stable")
            self.keys, self.ids = keys_all[order], ids_all[order]
            pos = np.searchsorted(self.keys, uk)
        return self.ids[pos][inv]

    def compact(self, used: np.ndarray) -> np.ndarray:
        """Forget the ids not in `used` (bool by id); returns old id -> new id (-1 if forgotten)."""
        remap = np.full(len(self), -1, dtype=np.int64)
        remap[used] = np.arange(int(used.sum()))
        self.lo, self.hi = self.lo[used], self.hi[used]
        keys = (self.lo << 32) | self.hi
        order = np.argsort(keys)
        self.keys, self.ids = keys[order], order.astype(np.int64)
        return remap


class ClockSynchronizer:
    """Implements the ClockCorrection protocol of the flow-latency join."""

    def __init__(self, reference: str | None = None, window_ns: int = 2 * NS, *, pure_tolerance_ns: float = 100.0,
                 min_pairs: int = 8, min_span_ns: int = NS // 4, stale_ns: int | None = None,
                 step_threshold_ns: float = 100.0, bins: int = 8, history: int = 32, bound_sigmas: float = 5.0,
                 bound_floor_ns: float = 2.0, wander_ppb_per_s: float = 5.0,
                 curvature_sd: float | None = 5.0, recency_s: float | None = 1.5) -> None:
        self.fixed_reference = reference
        self.window_ns = int(window_ns)
        self.min_pairs = min_pairs
        self.min_span_ns = int(min_span_ns)
        self.stale_ns = int(stale_ns if stale_ns is not None else window_ns // 2)
        self.step_threshold_ns = step_threshold_ns
        self.bins = bins
        self.history = history
        self.bound_sigmas = bound_sigmas
        self.bound_floor_ns = bound_floor_ns
        self.wander_ppb_per_s = wander_ppb_per_s
        self.curvature_sd = curvature_sd
        self.recency_s = recency_s
        self.filter = ProbePairFilter(tolerance_ns=pure_tolerance_ns, max_age_ns=2 * self.window_ns)
        self._names: list[str] = []
        self._index: dict[str, int] = {}
        self._buf: list[tuple[int, int, int, int, int, int]] = []
        self._store = _empty_store()
        self._edges = _EdgeRegistry()
        self._fits: PairFits | None = None      # rows = edge ids at the time of the fit
        self._fit_origin = 0
        self._sigma0 = 1.0                      # timestamp noise guess for edges without a fit yet
        self._recent: deque[tuple[int, np.ndarray, np.ndarray]] = deque()   # (now, sorted pair ids, senders)
        self._x = np.zeros(0)          # last offsets per node index (ns), 0 where unknown
        self._dr = np.zeros(0)         # last drifts per node index (ppb)
        self._reference: str | None = reference
        self._hist: dict[str, list[_Entry]] = {}
        self.solution: NetworkSolution | None = None
        self.replayed = 0
        self.edge_resets = 0
        self.edges_valid = 0

    # --- input -------------------------------------------------------------------------------------------
    def _node(self, name: str) -> int:
        i = self._index.get(name)
        if i is None:
            i = self._index[name] = len(self._names)
            self._names.append(name)
        return i

    def add_probe(self, p: ClockProbe) -> None:
        self._buf.append((self._node(p.sender), self._node(p.receiver), p.pair_id, p.idx, p.tx_ns, p.rx_ns))
        if len(self._buf) >= _BUF_LIMIT:   # bounded even if updates stall: the filter ages halves out itself
            self._flush_buf()

    def _flush_buf(self) -> None:
        if self._buf:
            cols = list(zip(*self._buf, strict=True))
            self._buf = []
            self.filter.push(*(np.array(c, dtype=d) for c, d in zip(
                cols, (np.int64, np.int64, np.uint64, np.int8, np.int64, np.int64), strict=True)))

    def add_probes(self, probes: Iterable[ClockProbe]) -> None:
        for p in probes:
            self.add_probe(p)

    def add_probes_arrays(self, sender: np.ndarray, receiver: np.ndarray, pair_id: np.ndarray, idx: np.ndarray,
                          tx_ns: np.ndarray, rx_ns: np.ndarray, nodes: Sequence[str] | None = None) -> None:
        """Fast path: columns of probe reports. With `nodes`, sender/receiver index into it; else names."""
        if nodes is not None:
            lut = np.array([self._node(n) for n in nodes], dtype=np.int64)
            s, r = lut[np.asarray(sender)], lut[np.asarray(receiver)]
        else:
            names, inv = np.unique(np.concatenate([np.asarray(sender), np.asarray(receiver)]), return_inverse=True)
            lut = np.array([self._node(str(n)) for n in names], dtype=np.int64)
            s, r = np.split(lut[inv], 2)
        self.filter.push(s, r, pair_id, idx, tx_ns, rx_ns)

    # --- estimation ----------------------------------------------------------------------------------------
    @property
    def reference(self) -> str | None:
        return self._reference

    @property
    def nodes(self) -> list[str]:
        """Nodes with a current estimate (the reference included)."""
        return sorted(self._hist)

    def update(self, now_ns: int) -> list[ClockEstimate]:
        now_ns = int(now_ns)
        self._flush_buf()
        new = self._samples(self.filter.pop(now_ns))
        new = self._drop_replays(new, now_ns)
        new = self._reset_stepped_edges(new)
        st = {c: np.concatenate([self._store[c], new[c]]) for c in _STORE}
        keep = (st["tau"] >= now_ns - self.window_ns) & (st["tau"] <= now_ns + self.window_ns)
        self._store = st = {c: v[keep] for c, v in st.items()}
        self._maybe_compact()
        st = self._store
        n_nodes = len(self._names)
        for name in ("_x", "_dr"):
            old = getattr(self, name)
            setattr(self, name, np.r_[old, np.zeros(n_nodes - old.size)])
        fits = self._fit(st, now_ns)
        self._fits, self._fit_origin = fits, now_ns
        stale = self.stale_ns / NS
        usable = fits.valid & (fits.t_last_fwd >= -stale) & (fits.t_last_rev >= -stale)
        self.edges_valid = int(usable.sum())
        present = np.zeros(n_nodes, dtype=bool)
        live = np.unique(st["edge"])
        present[self._edges.lo[live]] = present[self._edges.hi[live]] = True
        ref = self._pick_reference(present)
        if ref is None:
            self._hist.clear()
            self.solution = None
            return []
        sel = np.flatnonzero(usable)
        lo, hi = self._edges.lo[sel], self._edges.hi[sel]
        sol = None
        for _ in range(2):
            t_eval = self._x[lo] / NS                 # lo-local time when the reference reads now, in s
            m, var = fits.offset(sel, t_eval)
            drift, drift_var = fits.drift(sel, t_eval)
            drift = drift * (1.0 + self._dr[lo] * 1e-9)   # per reference second, not per lo-local second
            sol = solve_network(n_nodes, lo, hi, m, np.maximum(var, 1e-2), drift, np.maximum(drift_var, 1e-4),
                                self._index[ref])
            self._x = np.zeros(n_nodes)
            self._dr = np.zeros(n_nodes)
            self._x[sol.nodes], self._dr[sol.nodes] = sol.offset, sol.drift
        assert sol is not None
        self.solution = sol
        return self._publish(sol, ref, now_ns)

    def _samples(self, pp: PurePairs) -> dict[str, np.ndarray]:
        lo, hi = np.minimum(pp.sender, pp.receiver), np.maximum(pp.sender, pp.receiver)
        good = lo != hi
        if not good.all():
            pp = PurePairs(*(getattr(pp, f)[good] for f in ("sender", "receiver", "pair_id", "tx0", "tx1", "rx0",
                                                               "rx1")))
            lo, hi = lo[good], hi[good]
        fwd = pp.sender == lo
        tau = np.where(fwd, pp.tx0 + (pp.tx1 - pp.tx0) // 2, pp.rx0 + (pp.rx1 - pp.rx0) // 2)
        y = ((pp.rx0 - pp.tx0) + (pp.rx1 - pp.tx1)).astype(np.float64) / 2.0
        sp = pp.spacing_error
        if sp.size >= 32:   # spacing error = 4 stamps of noise: its robust spread / 2 = one stamp's
            self._sigma0 = max(1.4826 * float(np.median(np.abs(sp - np.median(sp)))) / 2.0, 0.5)
        edge = self._edges.ids_of(lo, hi) if lo.size else np.empty(0, dtype=np.int64)
        return {"edge": edge, "fwd": fwd, "tau": tau, "y": y, "sender": pp.sender, "pair_id": pp.pair_id}

    def _drop_replays(self, new: dict[str, np.ndarray], now_ns: int) -> dict[str, np.ndarray]:
        """Drop pairs matched in an earlier update (a replayed report) by (sender, pair_id)."""
        while self._recent and self._recent[0][0] < now_ns - 2 * self.window_ns:
            self._recent.popleft()
        pid, snd = new["pair_id"], new["sender"]
        rep = np.zeros(pid.size, dtype=bool)
        for _, ids, senders in self._recent:
            pos = np.clip(np.searchsorted(ids, pid), 0, max(ids.size - 1, 0))
            if ids.size:
                rep |= (ids[pos] == pid) & (senders[pos] == snd)
        if rep.any():
            self.replayed += int(rep.sum())
            new = {c: v[~rep] for c, v in new.items()}
        order = np.argsort(new["pair_id"])
        self._recent.append((now_ns, new["pair_id"][order], new["sender"][order]))
        return new

    def _reset_stepped_edges(self, new: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        fits = self._fits
        if fits is None or new["edge"].size == 0:
            return new
        edge = new["edge"]
        known = edge < fits.c.size
        if not known.any():
            return new
        t = (new["tau"] - self._fit_origin) / NS
        flag = np.zeros(edge.size, dtype=bool)
        flag[known] = floor_drops(fits, edge[known], new["fwd"][known], t[known], new["y"][known],
                                  threshold_ns=self.step_threshold_ns)
        if not flag.any():
            return new
        counts = np.bincount(edge[flag], minlength=len(self._edges))
        stepped = counts >= 2
        if not stepped.any():
            return new
        self.edge_resets += int(stepped.sum())
        cut = np.full(stepped.size, np.iinfo(np.int64).max)
        on = flag & stepped[edge]
        np.minimum.at(cut, edge[on], new["tau"][on])
        st = self._store
        self._store = {c: v[~stepped[st["edge"]]] for c, v in st.items()}
        drop = stepped[edge] & (new["tau"] < cut[edge])
        return {c: v[~drop] for c, v in new.items()}

    def _maybe_compact(self) -> None:
        n = len(self._edges)
        used = np.zeros(n, dtype=bool)
        used[self._store["edge"]] = True
        if n < 64 or used.sum() * 2 >= n:
            return
        remap = self._edges.compact(used)
        self._store["edge"] = remap[self._store["edge"]]
        if self._fits is not None:
            rows = np.flatnonzero(used[:self._fits.c.size])
            self._fits = PairFits(**{f: getattr(self._fits, f)[rows] for f in PairFits.__dataclass_fields__})

    def _fit(self, st: dict[str, np.ndarray], now_ns: int) -> PairFits:
        e = len(self._edges)
        prior_b = np.full(e, np.nan)
        prior_s = np.full(e, np.nan)
        if self._fits is not None:
            k = self._fits.c.size
            ok = self._fits.valid
            prior_b[:k] = np.where(ok, self._fits.b, np.nan)
            prior_s[:k] = np.where(ok, self._fits.sigma, np.nan)
        sigma = np.where(np.isfinite(prior_s), prior_s, self._sigma0)
        t = (st["tau"] - now_ns) / NS
        return fit_pairs(st["edge"], st["fwd"], t, st["y"], e, window_s=self.window_ns / NS, sigma0=sigma,
                         prior_b=prior_b, curvature_sd=self.curvature_sd, recency_s=self.recency_s, bins=self.bins,
                         min_pairs=self.min_pairs, min_span_s=self.min_span_ns / NS)

    def _pick_reference(self, present: np.ndarray) -> str | None:
        if self.fixed_reference is not None:
            i = self._index.get(self.fixed_reference)
            return self.fixed_reference if i is not None and present[i] else None
        cur = self._reference
        if cur is not None and present[self._index[cur]]:
            return cur
        names = [self._names[i] for i in np.flatnonzero(present)]
        self._reference = min(names) if names else None
        return self._reference

    def _publish(self, sol: NetworkSolution, ref: str, now_ns: int) -> list[ClockEstimate]:
        out: list[ClockEstimate] = []
        hist: dict[str, list[_Entry]] = {}
        for i, node in enumerate(sol.nodes.tolist()):
            name = self._names[node]
            is_ref = i == 0
            bound = 0.0 if is_ref else self.bound_sigmas * float(sol.offset_std[i]) + self.bound_floor_ns
            entry = _Entry(now_ns, float(sol.offset[i]), float(sol.drift[i]), bound,
                           0.0 if is_ref else float(sol.drift_std[i]))
            past = self._hist.get(name, [])
            if past and past[-1].ts_ns >= now_ns:
                past = [e for e in past if e.ts_ns < now_ns]
            hist[name] = (past + [entry])[-self.history:]
            out.append(ClockEstimate(node=name, ts_ns=now_ns, reference=ref, offset_ns=round(entry.offset_ns),
                                     drift_ppb=entry.drift_ppb, error_bound_ns=math.ceil(bound)))
        self._hist = hist
        return out

    # --- ClockCorrection ----------------------------------------------------------------------------------
    def to_reference(self, node: str, local_ns: int) -> tuple[int, int] | None:
        """`local_ns` on `node`'s clock converted to the reference clock, with an error bound (ns)."""
        hist = self._hist.get(node)
        if not hist:
            return None
        if node == self._reference:
            return int(local_ns), 0
        approx = local_ns - hist[-1].offset_ns
        k = bisect.bisect_left([e.ts_ns for e in hist], approx)
        e = hist[min(k, len(hist) - 1)]
        since = (local_ns - e.ts_ns - e.offset_ns) / (1.0 + e.drift_ppb * 1e-9)   # reference ns after ts_ns
        dt = abs(since) / NS
        bound = e.bound_ns + self.bound_sigmas * e.drift_std_ppb * dt + 0.5 * self.wander_ppb_per_s * dt * dt
        return e.ts_ns + round(since), math.ceil(bound)

    def estimate(self, node: str) -> ClockEstimate | None:
        """The latest estimate of `node`, as published."""
        hist = self._hist.get(node)
        if not hist or self._reference is None:
            return None
        e = hist[-1]
        return ClockEstimate(node=node, ts_ns=e.ts_ns, reference=self._reference, offset_ns=round(e.offset_ns),
                             drift_ppb=e.drift_ppb, error_bound_ns=math.ceil(e.bound_ns))

    @property
    def stats(self) -> dict[str, float]:
        s = self.filter.stats
        sol = self.solution
        return {"probes": s.probes, "duplicates": s.duplicates, "replayed_pairs": self.replayed, "pairs": s.pairs,
                "pure_pairs": s.pure, "expired_halves": s.expired, "malformed": s.malformed,
                "edge_resets": self.edge_resets, "edges_valid": self.edges_valid,
                "loop_chi2": sol.chi2 if sol else 0.0, "edges_downweighted": sol.downweighted if sol else 0}
