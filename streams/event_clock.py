"""Event time per partition, robust to a node whose clock is far off (see clocksync/probe_time.py).

Timers and state expiry run on event time, so a worker catching up on a backlog expires what a live one
would. Each partition's time is the lower median over its nodes of their newest timestamp: one node set an
hour ahead cannot expire everybody's state.
"""

from __future__ import annotations

from clocktower.streams.clocksync.probe_time import ProbeTime


class PartitionClock:
    def __init__(self) -> None:
        self._parts: dict[int, ProbeTime] = {}

    def observe(self, partition: int, node: str, ts_ns: int) -> None:
        t = self._parts.get(partition)
        if t is None:
            t = self._parts[partition] = ProbeTime()
        t.observe(node, ts_ns)

    def now(self, partition: int) -> int:
        """The partition's event time after what was observed (0 before any event)."""
        t = self._parts.get(partition)
        return t.advance() if t is not None else 0
