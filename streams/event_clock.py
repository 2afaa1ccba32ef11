"""Event time per partition: what timers and state expiry run on, robust to lagging and rogue sources.

A partition's events come from many nodes, through workers that may run behind: the one that regroups a
killed worker's input catches up seconds later. Expiring on the newest timestamp would drop a segment's
first half just before its late partner arrives. So a partition's time is the oldest newest-timestamp
among its nodes (it waits for the slowest), except for nodes more than `tolerance_ns` away from the
median: a node whose clock is an hour off, either way, neither holds expiry back nor rushes it, and a
node that went silent stops counting once the others are `tolerance_ns` past it. Time never goes back.
"""

from __future__ import annotations

DEFAULT_TOLERANCE_NS = 60 * 10**9


class _Partition:
    def __init__(self) -> None:
        self.newest: dict[str, int] = {}
        self.now_ns = 0


class PartitionClock:
    def __init__(self, tolerance_ns: int = DEFAULT_TOLERANCE_NS) -> None:
        self.tolerance_ns = tolerance_ns
        self._parts: dict[int, _Partition] = {}

    def observe(self, partition: int, node: str, ts_ns: int) -> None:
        p = self._parts.get(partition)
        if p is None:
            p = self._parts[partition] = _Partition()
        if ts_ns > p.newest.get(node, 0):
            p.newest[node] = ts_ns

    def now(self, partition: int) -> int:
        """The partition's event time after what was observed (0 before any event)."""
        p = self._parts.get(partition)
        if p is None or not p.newest:
            return 0 if p is None else p.now_ns
        times = sorted(p.newest.values())
        median = times[(len(times) - 1) // 2]
        near = [t for t in times if abs(t - median) <= self.tolerance_ns]
        p.now_ns = max(p.now_ns, near[0])
        for node in [n for n, t in p.newest.items() if t < p.now_ns - self.tolerance_ns]:
            del p.newest[node]   # silent (or far behind) for the tolerance: it stops counting
        return p.now_ns
