"""Probe time: the time the probes seen so far reach up to, robust to a node whose clock is far off.

The synchronizer's sliding window and the estimate cadence run on probe time, not on the worker's wall
clock (a worker catching up on a backlog must estimate as often as a live one). Each probe's rx_ns is on
its receiver's own clock, and fixing badly-off clocks is the point of the exercise, so a plain maximum
would let one node set an hour ahead drag the window past every real sample and stop all estimates.
Probe time is instead the lower median over receivers of each one's newest rx_ns: it moves only when
most receivers have moved. Receivers silent for `stale_ns` of probe time stop counting, so nodes that
leave do not hold it back. It never goes backwards.
"""

from __future__ import annotations


class ProbeTime:
    def __init__(self, stale_ns: int = 10_000_000_000) -> None:
        self.stale_ns = stale_ns
        self.now_ns = 0
        self._latest: dict[str, int] = {}

    def observe(self, receiver: str, rx_ns: int) -> None:
        if rx_ns > self._latest.get(receiver, 0):
            self._latest[receiver] = rx_ns

    def advance(self) -> int:
        """Probe time after the probes observed so far."""
        if self._latest:
            floor = self.now_ns - self.stale_ns
            for r in [r for r, t in self._latest.items() if t < floor]:
                del self._latest[r]
            times = sorted(self._latest.values())
            if times:
                self.now_ns = max(self.now_ns, times[(len(times) - 1) // 2])
        return self.now_ns
