"""Timestamp conversion from published clock estimates alone (the ClockCorrection of the flow join).

    view = ClockView()
    view.add_estimates(estimates)          # ClockEstimate events, e.g. read from analytics.clock
    view.to_reference("node-7", local_ns)  # (reference_ns, error_bound_ns) or None

Every stream worker keeps its own view, fed from the estimates topic, so it needs nothing of the solver.

A solve publishes one estimate per node, all with the same ts_ns (the solve's now, on the reference
clock) and `solve_nodes` = how many. The latest solve is the newest one received in full (or superseded
by a newer one's first estimate: a reader that started mid-solve still gets going). While a newer
solve's estimates come in, one record per node, every node of the latest solve keeps converting, and
those already received use their new estimate. A node without an estimate in the latest solve (it
left, stepped, or was cut off) converts to None, and so does every node before the first estimate.
Estimates against another reference than the latest solve's are dropped: offsets against different
references do not mix (when the reference changes, the old one's history is dropped at the new one's
first estimate).

Conversion: timestamps from the past are converted with the first estimate made after them (its fit
window covered them); newer ones with the latest. The bound is the estimate's `error_bound_ns` plus
`bound_sigmas` drift standard deviations and a drift-wander allowance (`wander_ppb_per_s`, a random
walk's quadratic growth) for the time between the estimate and the timestamp. A timestamp more than
`max_gap_ns` (30 s) from the estimate it would use is not converted (None): a worker started after a stop
reads the last estimates back, and they must not be stretched over the gap. The reference converts to
itself with bound 0. Each node keeps its last `history` estimates: 128, i.e. 32 s at the default 4 solves a second,
so a flow join that runs behind the estimates by up to that much still converts with an estimate near its
timestamps (with 32, a worker 8 s behind under load converted with estimates 10 s away: bounds of ~1 us; measured
in a demo beside a test run). About 100 KB a node.

`awaits(node, local_ns)`: whether a better conversion may still come: no estimate yet, or the node's newest
estimate is older than the timestamp (converting it now extrapolates; the estimate after it interpolates).
The flow join holds a completed segment while either end awaits, within a bound (streams/joins/flow_latency.py).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable

from clocktower.schemas.analytics import ClockEstimate

NS = 1_000_000_000


class ClockView:
    def __init__(self, history: int = 128, bound_sigmas: float = 5.0, wander_ppb_per_s: float = 5.0,
                 max_gap_ns: int = 30 * NS) -> None:
        self.history = history
        self.max_gap_ns = max_gap_ns
        self.bound_sigmas = bound_sigmas
        self.wander_ppb_per_s = wander_ppb_per_s
        self._hist: dict[str, list[ClockEstimate]] = {}    # by node, ts_ns ascending
        self._ts: dict[str, list[int]] = {}
        self._latest_ns: int | None = None                 # the latest solve (complete or superseded)
        self._pending: tuple[int, set[str]] | None = None   # the solve coming in: its ts_ns, nodes received
        self._reference: str | None = None

    @property
    def reference(self) -> str | None:
        return self._reference

    @property
    def latest_ns(self) -> int | None:
        """ts_ns of the latest solve (its estimates all received, or a newer solve begun)."""
        return self._latest_ns

    def clear(self) -> None:
        """Forget every estimate (a solve found no reference: nothing converts until the next estimates)."""
        self._hist.clear()
        self._ts.clear()
        self._latest_ns = self._pending = self._reference = None

    def _newest_ns(self) -> int:
        return max(self._latest_ns or 0, self._pending[0] if self._pending else 0)

    def add_estimates(self, estimates: Iterable[ClockEstimate]) -> None:
        for e in estimates:
            if e.reference != self._reference:
                if self._reference is not None and e.ts_ns <= self._newest_ns():
                    continue              # an older solve's, against another reference
                self.clear()
                self._reference = e.reference
            self._insert(e)
            if self._latest_ns is not None and e.ts_ns <= self._latest_ns:
                continue                  # a replay of a solve already in
            if self._pending is None or e.ts_ns > self._pending[0]:
                if self._pending is not None:
                    self._latest_ns = self._pending[0]      # superseded before it was complete
                self._pending = (e.ts_ns, set())
            ts, seen = self._pending
            if e.ts_ns == ts:
                seen.add(e.node)
                if len(seen) >= e.solve_nodes:
                    self._latest_ns, self._pending = ts, None

    def _insert(self, e: ClockEstimate) -> None:
        hist = self._hist.setdefault(e.node, [])
        ts = self._ts.setdefault(e.node, [])
        k = bisect.bisect_left(ts, e.ts_ns)
        if k < len(ts) and ts[k] == e.ts_ns:
            hist[k] = e                   # the same solve again: the newer copy wins
            return
        hist.insert(k, e)
        ts.insert(k, e.ts_ns)
        if len(ts) > self.history:
            del hist[0], ts[0]

    def _current(self, node: str) -> list[ClockEstimate] | None:
        hist = self._hist.get(node)
        if not hist or (self._latest_ns is not None and hist[-1].ts_ns < self._latest_ns):
            return None
        return hist

    @property
    def nodes(self) -> list[str]:
        """Nodes with an estimate in the latest solve or the one coming in (the reference included)."""
        return sorted(n for n in self._hist if self._current(n))

    def estimate(self, node: str) -> ClockEstimate | None:
        """The latest estimate of `node`, if it is in the latest solve (or the one coming in)."""
        hist = self._current(node)
        return hist[-1] if hist else None

    def awaits(self, node: str, local_ns: int) -> bool:
        """Whether an estimate made after `local_ns` (on `node`'s clock) may still come: none has come yet (the
        first solve takes a few seconds of probes), the node has none in the latest solve, or its newest one is older
        than the timestamp. Never for the reference, which converts to itself."""
        if self._reference is None:
            return True
        if node == self._reference:
            return False
        hist = self._current(node)
        if hist is None:
            return True     # not (yet) in the latest solve: a joining node's first estimate may be on its way
        newest = hist[-1]
        return local_ns - newest.offset_ns > newest.ts_ns

    def to_reference(self, node: str, local_ns: int) -> tuple[int, int] | None:
        """`local_ns` on `node`'s clock converted to the reference clock, with an error bound (ns)."""
        hist = self._current(node)
        if hist is None:
            return None
        if node == self._reference:
            return int(local_ns), 0
        approx = local_ns - hist[-1].offset_ns
        k = bisect.bisect_left(self._ts[node], approx)
        e = hist[min(k, len(hist) - 1)]
        since = (local_ns - e.ts_ns - e.offset_ns - e.offset_frac_ns) / (1.0 + e.drift_ppb * 1e-9)   # after ts_ns
        if abs(since) > self.max_gap_ns:
            return None   # no estimate near it (a worker reading old estimates after a stop): not converted
        dt = abs(since) / NS
        bound = e.error_bound_ns + self.bound_sigmas * e.drift_std_ppb * dt + 0.5 * self.wander_ppb_per_s * dt * dt
        return e.ts_ns + round(since), math.ceil(bound)
