"""Match the two probes of each coded pair and keep the pure pairs (Huygens' coded probes).

A sender emits probe 0 and probe 1 of a pair a known spacing apart (tx_ns on its own clock); the
receiver reports both with its rx_ns. If neither probe waited in a queue, they arrive with the spacing
they were sent with, up to timestamp noise; a queue almost always changes the spacing. So a pair is
*pure* when |(rx1 - rx0) - (tx1 - tx0)| <= tolerance, and only pure pairs feed the fit.

Reports may come duplicated, reordered (within and across batches) or with one half lost. Halves are
keyed by (sender, pair_id, idx): exact repeats are dropped (the first copy wins), a half waits in
`pending` until its partner comes, and a half older than `max_age_ns` (its partner is lost) is
expired. Replays of a pair already matched in an earlier batch are the caller's to drop (it keeps the
pair keys of its window; see `ClockSynchronizer`). Vectorized: one lexsort per batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

COLUMNS = ("sender", "receiver", "pair_id", "idx", "tx_ns", "rx_ns")
DTYPES = (np.int64, np.int64, np.uint64, np.int8, np.int64, np.int64)
MAX_SPACING_NS = 1_000_000


def _empty() -> dict[str, np.ndarray]:
    return {c: np.empty(0, dtype=d) for c, d in zip(COLUMNS, DTYPES, strict=True)}


@dataclass
class PairStats:
    probes: int = 0
    duplicates: int = 0
    expired: int = 0
    malformed: int = 0
    pairs: int = 0
    pure: int = 0


@dataclass
class PurePairs:
    """Matched pure pairs, one row each (sender/receiver are the caller's node indices)."""

    sender: np.ndarray
    receiver: np.ndarray
    pair_id: np.ndarray
    tx0: np.ndarray
    tx1: np.ndarray
    rx0: np.ndarray
    rx1: np.ndarray

    def __len__(self) -> int:
        return int(self.sender.size)

    @property
    def spacing_error(self) -> np.ndarray:
        """(rx1 - rx0) - (tx1 - tx0): timestamp noise (std = 2x the per-stamp noise) plus queueing change."""
        return (self.rx1 - self.rx0) - (self.tx1 - self.tx0)


@dataclass
class ProbePairFilter:
    tolerance_ns: float = 100.0
    max_age_ns: int = 4_000_000_000
    max_pending: int = 1_000_000
    stats: PairStats = field(default_factory=PairStats)

    def __post_init__(self) -> None:
        self._chunks: list[tuple[np.ndarray, ...]] = []
        self.pending = _empty()

    def push(self, sender: np.ndarray, receiver: np.ndarray, pair_id: np.ndarray, idx: np.ndarray,
             tx_ns: np.ndarray, rx_ns: np.ndarray) -> None:
        """Queue one batch of probe reports (columns of equal length)."""
        cols = tuple(np.asarray(c, dtype=d) for c, d in zip((sender, receiver, pair_id, idx, tx_ns, rx_ns),
                                                           DTYPES, strict=True))
        if len({c.size for c in cols}) != 1:
            raise ValueError("probe columns differ in length")
        self._chunks.append(cols)
        self.stats.probes += cols[0].size

    def pop(self, now_ns: int) -> PurePairs:
        """Match everything pushed so far with the pending halves; return the pure pairs."""
        cols = {c: np.concatenate([self.pending[c], *(ch[i] for ch in self._chunks)])
                for i, c in enumerate(COLUMNS)}
        self._chunks.clear()
        s, r, pid, idx, tx, rx = (cols[c] for c in COLUMNS)
        bad = (idx < 0) | (idx > 1)
        if bad.any():
            self.stats.malformed += int(bad.sum())
            keep = ~bad
            s, r, pid, idx, tx, rx = s[keep], r[keep], pid[keep], idx[keep], tx[keep], rx[keep]
        order = np.lexsort((idx, pid, s))     # stable: among repeats the earliest report comes first
        s, r, pid, idx, tx, rx = s[order], r[order], pid[order], idx[order], tx[order], rx[order]
        same_pair = np.zeros(s.size, dtype=bool)
        same_pair[1:] = (s[1:] == s[:-1]) & (pid[1:] == pid[:-1])
        dup = np.zeros(s.size, dtype=bool)
        dup[1:] = same_pair[1:] & (idx[1:] == idx[:-1])
        if dup.any():
            self.stats.duplicates += int(dup.sum())
            keep = ~dup
            s, r, pid, idx, tx, rx = s[keep], r[keep], pid[keep], idx[keep], tx[keep], rx[keep]
            same_pair = np.zeros(s.size, dtype=bool)
            same_pair[1:] = (s[1:] == s[:-1]) & (pid[1:] == pid[:-1])
        # After dedup a matched pair is an idx-0 row directly followed by the idx-1 row of the same pair.
        first = np.flatnonzero(same_pair[1:]) if s.size else np.empty(0, dtype=np.int64)
        second = first + 1
        matched = np.zeros(s.size, dtype=bool)
        matched[first] = matched[second] = True
        rest = ~matched
        stale = rest & (rx < now_ns - self.max_age_ns)
        self.stats.expired += int(stale.sum())
        left = np.flatnonzero(rest & ~stale)[-self.max_pending:]
        self.pending = {"sender": s[left], "receiver": r[left], "pair_id": pid[left], "idx": idx[left],
                        "tx_ns": tx[left], "rx_ns": rx[left]}
        tx0, tx1, rx0, rx1 = tx[first], tx[second], rx[first], rx[second]
        ok = (r[first] == r[second]) & (tx1 > tx0) & (tx1 - tx0 <= MAX_SPACING_NS)
        self.stats.malformed += int((~ok).sum()) * 2
        self.stats.pairs += int(ok.sum())
        pure = ok & (np.abs((rx1 - rx0) - (tx1 - tx0)) <= self.tolerance_ns)
        self.stats.pure += int(pure.sum())
        sel = first[pure]
        return PurePairs(s[sel], r[sel], pid[sel], tx0[pure], tx1[pure], rx0[pure], rx1[pure])
