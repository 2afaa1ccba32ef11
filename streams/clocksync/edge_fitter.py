"""Level 1 of clock sync: probes in, one fit per probe-graph edge out (pure logic).

    fitter = EdgeFitter()
    fitter.add_probe(probe)                # ClockProbe reports, any order, duplicates and losses allowed
    fits = fitter.update(now_ns)           # list[ClockEdgeFit], one per edge with samples in the window

Everything here is per edge, so the probes can be spread over several fitters as long as all probes of
one edge (its two ends, either direction) reach the same one; each fitter holds many edges. The network
solve (network_solver.py) needs only the ClockEdgeFit summaries.

`now_ns` is the time the probes fed so far reach up to (probe time, see probe_time.py); it anchors the
sliding window and is the origin of every fit of that update. Each update:

1. `ProbePairFilter` matches the pairs reported since the last update and keeps the pure ones; a pair
   replayed after it was matched is dropped by its (sender, pair_id).
2. Each pure pair becomes one sample of its edge (lo, hi; lo's name sorts first): its mean time on lo's
   clock and its mean one-way "delay + offset". Samples older than `window_ns` are dropped.
3. Clock steps: a new sample far *below* its edge's previous floor (queueing only adds delay; "far" is
   max(`step_threshold_ns`, 12 sigma)) means one of the two clocks stepped (or the path got shorter).
   Two such samples reset the edge: its older samples are dropped, so it refits from post-step data and
   the stepped node is back within about `min_span_ns` plus an update, instead of carrying a blend for a
   whole window. Smaller steps are absorbed like drift and age out of the window.
4. `fit_pairs` fits every edge (both directions, floor core; see pair_fit.py). Edges with too few core
   samples or too short a span are published with valid = False (the solve still learns that their nodes
   are present); staleness is the solve's call, from the fits' sample times.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence

import numpy as np

from clocktower.schemas.analytics import ClockEdgeFit
from clocktower.schemas.telemetry import ClockProbe
from clocktower.streams.clocksync.edge_registry import EdgeRegistry
from clocktower.streams.clocksync.node_ids import NodeIds
from clocktower.streams.clocksync.pair_fit import PairFits, fit_pairs, floor_drops
from clocktower.streams.clocksync.probe_filter import ProbePairFilter, PurePairs

NS = 1_000_000_000
_BUF_LIMIT = 100_000           # probes buffered by add_probe before they are handed to the filter
_STORE = ("edge", "fwd", "tau", "y", "sender", "pair_id")
_STORE_DT = (np.int64, bool, np.int64, np.float64, np.int64, np.uint64)


def _empty_store() -> dict[str, np.ndarray]:
    return {c: np.empty(0, dtype=d) for c, d in zip(_STORE, _STORE_DT, strict=True)}


class EdgeFitter:
    def __init__(self, window_ns: int = 2 * NS, *, pure_tolerance_ns: float = 100.0, min_pairs: int = 8,
                 min_span_ns: int = NS // 4, step_threshold_ns: float = 100.0, bins: int = 8,
                 curvature_sd: float | None = 5.0, recency_s: float | None = 1.5) -> None:
        self.window_ns = int(window_ns)
        self.min_pairs = min_pairs
        self.min_span_ns = int(min_span_ns)
        self.step_threshold_ns = step_threshold_ns
        self.bins = bins
        self.curvature_sd = curvature_sd
        self.recency_s = recency_s
        self.filter = ProbePairFilter(tolerance_ns=pure_tolerance_ns, max_age_ns=2 * self.window_ns)
        self._ids = NodeIds()
        self._names = self._ids.names
        self._buf: list[tuple[int, int, int, int, int, int]] = []
        self._store = _empty_store()
        self._edges = EdgeRegistry()
        self._fits: PairFits | None = None      # rows = edge ids at the time of the fit
        self._fit_origin = 0
        self._sigma0 = 1.0                      # timestamp noise guess for edges without a fit yet
        self._recent: deque[tuple[int, np.ndarray, np.ndarray]] = deque()   # (now, sorted pair ids, senders)
        self.replayed = 0
        self.edge_resets = 0
        self.edges_fitted = 0
        self.edges_valid = 0

    # --- input -------------------------------------------------------------------------------------------
    def _node(self, name: str) -> int:
        return self._ids.id(name)

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

    @property
    def edges_registered(self) -> int:
        """Edges with state here (forgotten edges are compacted away once they are half of them)."""
        return len(self._edges)

    # --- fitting -------------------------------------------------------------------------------------------
    def update(self, now_ns: int) -> list[ClockEdgeFit]:
        """Fit every edge with samples in the window; one ClockEdgeFit each, origin ts_ns = now_ns."""
        now_ns = int(now_ns)
        self._flush_buf()
        new = self._samples(self.filter.pop(now_ns))
        new = self._drop_replays(new, now_ns)
        new = self._reset_stepped_edges(new)
        st = {c: np.concatenate([self._store[c], new[c]]) for c in _STORE}
        keep = (st["tau"] >= now_ns - self.window_ns) & (st["tau"] <= now_ns + self.window_ns)
        self._store = {c: v[keep] for c, v in st.items()}
        self._maybe_compact()
        fits = self._fit(self._store, now_ns)
        self._fits, self._fit_origin = fits, now_ns
        return self._summaries(fits, now_ns)

    def _samples(self, pp: PurePairs) -> dict[str, np.ndarray]:
        a, b = np.minimum(pp.sender, pp.receiver), np.maximum(pp.sender, pp.receiver)
        good = a != b
        if not good.all():
            pp = PurePairs(*(getattr(pp, f)[good] for f in ("sender", "receiver", "pair_id", "tx0", "tx1", "rx0",
                                                               "rx1")))
            a, b = a[good], b[good]
        sp = pp.spacing_error
        if sp.size >= 32:   # spacing error = 4 stamps of noise: its robust spread / 2 = one stamp's
            self._sigma0 = max(1.4826 * float(np.median(np.abs(sp - np.median(sp)))) / 2.0, 0.5)
        edge = self._edges.ids_of(a, b, self._names) if a.size else np.empty(0, dtype=np.int64)
        fwd = pp.sender == self._edges.lo[edge]
        tau = np.where(fwd, pp.tx0 + (pp.tx1 - pp.tx0) // 2, pp.rx0 + (pp.rx1 - pp.rx0) // 2)
        y = ((pp.rx0 - pp.tx0) + (pp.rx1 - pp.tx1)).astype(np.float64) / 2.0
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

    def _summaries(self, fits: PairFits, now_ns: int) -> list[ClockEdgeFit]:
        """One ClockEdgeFit per edge with samples; values that JSON cannot carry make the fit invalid."""
        rows = np.unique(self._store["edge"])
        vals = np.stack([fits.D[rows], fits.c[rows], fits.b[rows], fits.a[rows], fits.sigma[rows],
                         fits.t_first[rows]], axis=1)
        cov = fits.cov[rows].reshape(-1, 16)
        valid = fits.valid[rows] & np.isfinite(vals).all(axis=1) & np.isfinite(cov).all(axis=1)
        vals = np.nan_to_num(vals, nan=0.0, posinf=0.0, neginf=0.0)
        self.edges_fitted, self.edges_valid = int(rows.size), int(valid.sum())
        out = []
        names = self._names
        n_fwd = np.rint(fits.n_fwd[rows]).astype(np.int64).tolist()
        n_rev = np.rint(fits.n_rev[rows]).astype(np.int64).tolist()
        for lo, hi, v, cv, nf, nr, tf, tr, ok in zip(
                self._edges.lo[rows].tolist(), self._edges.hi[rows].tolist(), vals.tolist(), cov.tolist(), n_fwd,
                n_rev, fits.t_last_fwd[rows].tolist(), fits.t_last_rev[rows].tolist(), valid.tolist(), strict=True):
            out.append(ClockEdgeFit(
                node=names[lo], ts_ns=now_ns, hi=names[hi], delay_ns=v[0], offset_ns=v[1], drift_ppb=v[2],
                curvature_ns_per_s2=v[3], cov=cv if ok else [], sigma_ns=v[4], n_fwd=nf, n_rev=nr, t_first_s=v[5],
                t_last_fwd_s=tf if np.isfinite(tf) else None, t_last_rev_s=tr if np.isfinite(tr) else None,
                valid=ok))
        return out

    @property
    def stats(self) -> dict[str, int]:
        s = self.filter.stats
        return {"probes": s.probes, "duplicates": s.duplicates, "replayed_pairs": self.replayed, "pairs": s.pairs,
                "pure_pairs": s.pure, "expired_halves": s.expired, "malformed": s.malformed,
                "edge_resets": self.edge_resets, "edges_fitted": self.edges_fitted,
                "edges_valid_fits": self.edges_valid}
