"""A TrafficShaper that only remembers: the demo's simulated nodes, and tests without a kernel."""

from __future__ import annotations

import threading

from clocktower.actuators.traffic_shaper import TrafficShaper


class SimulatedShaper(TrafficShaper):
    def __init__(self) -> None:
        self._share: float | None = None
        self._lock = threading.Lock()

    def limit(self, share: float) -> str:
        with self._lock:
            if self._share == share:
                return f"low class already at {share:.0%} of the link"
            self._share = share
        return f"low class capped at {share:.0%} of the link" if share else "low class paused"

    def resume(self) -> str:
        with self._lock:
            was, self._share = self._share, 1.0
        return "low class already unlimited" if was in (None, 1.0) else "low class given the whole link again"

    def low_share(self) -> float | None:
        return self._share
