"""Stable small integer ids for probe-graph edges, so per-edge state is plain array rows (pure logic).

An edge is an unordered pair of node indices. It is looked up by (min index, max index), but oriented by
*name*: `lo` is the end whose name sorts first. Several fitters each number the nodes in the order they
first see them, so only the names give every fitter (and the network solve) the same orientation.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class EdgeRegistry:
    def __init__(self) -> None:
        self.keys = np.empty(0, dtype=np.int64)      # sorted a << 32 | b (a < b: node indices)
        self.ids = np.empty(0, dtype=np.int64)       # id of each sorted key
        self.lo = np.empty(0, dtype=np.int64)        # by id: the end whose name sorts first
        self.hi = np.empty(0, dtype=np.int64)

    def __len__(self) -> int:
        return int(self.lo.size)

    def ids_of(self, a: np.ndarray, b: np.ndarray, names: Sequence[str]) -> np.ndarray:
        """Ids of the edges (a, b), a < b node indices into `names`; unseen edges are registered."""
        keys = (a << 32) | b
        uk, inv = np.unique(keys, return_inverse=True)
        pos = np.searchsorted(self.keys, uk)
        found = pos < self.keys.size
        found[found] = self.keys[pos[found]] == uk[found]
        fresh = uk[~found]
        if fresh.size:
            fa, fb = fresh >> 32, fresh & 0xFFFFFFFF
            flip = np.array([names[i] > names[j] for i, j in zip(fa.tolist(), fb.tolist(), strict=True)], dtype=bool)
            new_ids = np.arange(len(self), len(self) + fresh.size)
            self.lo = np.r_[self.lo, np.where(flip, fb, fa)]
            self.hi = np.r_[self.hi, np.where(flip, fa, fb)]
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
        keys = (np.minimum(self.lo, self.hi) << 32) | np.maximum(self.lo, self.hi)
        order = np.argsort(keys)
        self.keys, self.ids = keys[order], order.astype(np.int64)
        return remap
