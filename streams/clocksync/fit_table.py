"""The latest ClockEdgeFit of every edge, as array rows the network solve reads at once (pure logic).

The summaries come as event objects, one per edge and fitter update, possibly one at a time; `add` only
queues them, and `flush` (once per solve) turns them into columns, so the solve's work is vectorized. An
older summary of an edge never replaces a newer one (fitters publish in order, but a replay may not).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from clocktower.schemas.analytics import ClockEdgeFit
from clocktower.streams.clocksync.node_ids import NodeIds
from clocktower.streams.clocksync.pair_fit import PairFits

_F8 = ("D", "c", "b", "a", "sigma", "n_fwd", "n_rev", "t_first", "t_last_fwd", "t_last_rev")


def _row(f: ClockEdgeFit) -> tuple[float, ...]:
    return (f.delay_ns, f.offset_ns, f.drift_ppb, f.curvature_ns_per_s2, f.sigma_ns, float(f.n_fwd),
            float(f.n_rev), f.t_first_s, -np.inf if f.t_last_fwd_s is None else f.t_last_fwd_s,
            -np.inf if f.t_last_rev_s is None else f.t_last_rev_s)


class FitTable:
    def __init__(self) -> None:
        self._ids = NodeIds()
        self.names = self._ids.names              # node names; node index = position (never reused)
        self._rows: dict[tuple[str, str], int] = {}
        self.lo = np.empty(0, dtype=np.int64)    # node indices, by row
        self.hi = np.empty(0, dtype=np.int64)
        self.origin = np.empty(0, dtype=np.int64)
        self.cols = {c: np.empty(0) for c in _F8}
        self.cov = np.empty((0, 4, 4))
        self.valid = np.empty(0, dtype=bool)
        self._pending: dict[tuple[str, str], ClockEdgeFit] = {}

    def __len__(self) -> int:
        return int(self.lo.size)

    def node(self, name: str) -> int:
        return self._ids.id(name)

    def index_of(self, name: str) -> int | None:
        return self._ids.get(name)

    def add(self, fits: Iterable[ClockEdgeFit]) -> int:
        """Queue each fit unless its edge has a newer one; returns the newest origin queued (0: none).
        Cheap per call (a dict entry per fit), so fits may come one at a time; `flush` makes them rows."""
        newest = 0
        pending = self._pending
        for f in fits:
            key = (f.node, f.hi)
            old = pending.get(key)
            if old is None or old.ts_ns <= f.ts_ns:
                pending[key] = f
                newest = max(newest, f.ts_ns)
        return newest

    def flush(self) -> None:
        """The queued fits into their rows (new edges get new rows)."""
        if not self._pending:
            return
        fresh: list[tuple[int, int]] = []
        rows: list[int] = []
        fs: list[ClockEdgeFit] = []
        n = len(self._rows)
        for key, f in self._pending.items():
            r = self._rows.get(key)
            if r is None:
                r = self._rows[key] = n + len(fresh)
                fresh.append((self.node(f.node), self.node(f.hi)))
            elif self.origin[r] > f.ts_ns:
                continue                 # a replay of an older fit
            rows.append(r)
            fs.append(f)
        self._pending = {}
        if fresh:
            k = len(fresh)
            a, b = np.array(fresh, dtype=np.int64).reshape(-1, 2).T
            self.lo, self.hi = np.r_[self.lo, a], np.r_[self.hi, b]
            self.origin = np.r_[self.origin, np.zeros(k, dtype=np.int64)]
            self.cols = {c: np.r_[v, np.zeros(k)] for c, v in self.cols.items()}
            self.cov = np.concatenate([self.cov, np.full((k, 4, 4), np.inf)])
            self.valid = np.r_[self.valid, np.zeros(k, dtype=bool)]
        if not fs:
            return
        idx = np.array(rows, dtype=np.int64)
        vals = np.array([_row(f) for f in fs], dtype=np.float64)
        for j, c in enumerate(_F8):
            self.cols[c][idx] = vals[:, j]
        self.origin[idx] = [f.ts_ns for f in fs]
        ok = np.array([f.valid and len(f.cov) == 16 for f in fs], dtype=bool)
        self.valid[idx] = ok
        self.cov[idx] = np.inf
        if ok.any():
            self.cov[idx[ok]] = np.array([f.cov for f, o in zip(fs, ok.tolist(), strict=True) if o]).reshape(-1, 4, 4)

    def keep(self, rows: np.ndarray) -> None:
        """Forget every row not in `rows` (bool by row; call after `flush`)."""
        if rows.all():
            return
        self.lo, self.hi, self.origin, self.valid, self.cov = (v[rows] for v in (self.lo, self.hi, self.origin,
                                                                                  self.valid, self.cov))
        self.cols = {c: v[rows] for c, v in self.cols.items()}
        names = self.names
        self._rows = {(names[a], names[b]): i for i, (a, b) in enumerate(zip(self.lo.tolist(), self.hi.tolist(),
                                                                             strict=True))}

    def pair_fits(self) -> PairFits:
        """The rows as PairFits (each row's t relative to its own origin)."""
        c = self.cols
        return PairFits(D=c["D"], c=c["c"], b=c["b"], a=c["a"], cov=self.cov, sigma=c["sigma"], n_fwd=c["n_fwd"],
                        n_rev=c["n_rev"], t_first=c["t_first"], t_last_fwd=c["t_last_fwd"],
                        t_last_rev=c["t_last_rev"], valid=self.valid)
