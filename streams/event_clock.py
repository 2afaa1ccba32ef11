"""Event time per partition: what timers and state expiry run on, robust to lagging and rogue sources.

A partition's events come from many nodes, through workers that may run behind: the one that regroups a
killed worker's input catches up seconds later. Expiring on the newest timestamp would drop a segment's
first half just before its late partner arrives. So a partition's time is the oldest newest-timestamp
among its nodes (it waits for the slowest), except for nodes more than `tolerance_ns` away from the
median: a minority of nodes whose clocks are far off, either way, neither holds expiry back nor rushes it
(with two nodes, or half of them off, the lower median is theirs: it needs three or more). A node not
heard from for `silent_s` of the worker's own clock stops counting (it left, or its partition moved), so
time goes on even when most nodes of a partition go quiet. Time never goes back.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

DEFAULT_TOLERANCE_NS = 120 * 10**9
DEFAULT_SILENT_S = 60.0


@dataclass
class _Partition:
    newest: dict[str, int] = field(default_factory=dict)
    heard: dict[str, float] = field(default_factory=dict)   # node -> the worker's monotonic clock
    now_ns: int = 0


class PartitionClock:
    def __init__(self, tolerance_ns: int = DEFAULT_TOLERANCE_NS, silent_s: float = DEFAULT_SILENT_S,
                 wall: Callable[[], float] = time.monotonic) -> None:
        self.tolerance_ns = tolerance_ns
        self.silent_s = silent_s
        self.wall = wall
        self._parts: dict[int, _Partition] = {}

    def observe(self, partition: int, node: str, ts_ns: int) -> None:
        p = self._parts.get(partition)
        if p is None:
            p = self._parts[partition] = _Partition()
        if ts_ns > p.newest.get(node, 0):
            p.newest[node] = ts_ns
        p.heard[node] = self.wall()

    def now(self, partition: int) -> int:
        """The partition's event time after what was observed (0 before any event)."""
        p = self._parts.get(partition)
        if p is None:
            return 0
        cutoff = self.wall() - self.silent_s
        for node in [n for n, t in p.heard.items() if t < cutoff]:
            del p.heard[node], p.newest[node]
        if p.newest:
            times = sorted(p.newest.values())
            median = times[(len(times) - 1) // 2]
            p.now_ns = max(p.now_ns, next(t for t in times if t >= median - self.tolerance_ns))
        return p.now_ns
