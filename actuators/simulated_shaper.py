"""A TrafficShaper that only remembers: the demo's simulated nodes, and tests without a kernel."""

from __future__ import annotations

import threading

from clocktower.actuators.traffic_shaper import Holders, TrafficShaper


class SimulatedShaper(TrafficShaper):
    def __init__(self) -> None:
        self._share: float | None = None
        self._holders = Holders()
        self._lock = threading.Lock()

    def limit(self, share: float, holder: str) -> str:
        with self._lock:
            self._share = self._holders.hold(holder, share)
            now = self._share
        return f"low class capped at {now:.0%} of the link" if now else "low class paused"

    def resume(self, holder: str) -> str:
        with self._lock:
            left = self._holders.release(holder)
            self._share = 1.0 if left is None else left
        return ("low class given the whole link again" if left is None else
                f"low class still capped at {left:.0%} for another link's congestion")

    def low_share(self) -> float | None:
        return self._share

    def leftover(self) -> bool:
        return False   # nothing outlives the process
