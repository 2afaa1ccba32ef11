"""A fleet-wide budget for disruptive remediation (drain + spare), in processing time.

A forged or buggy stream of fatal GPU faults must not drain the fleet: at most
`max_per_window` replacements run per `window_ns` without a human; the rest are
held as "needs human approval" and counted. The window runs on the worker's own
monotonic clock, never on event time: event times are written by the producers,
so forged timestamps spread an hour apart would each find an empty window, and one
dated far in the future would hold the budget shut against real faults. The
budget lives in one worker; with several stream workers each holds its own, so the
fleet-wide limit is N x workers.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

HOUR_NS = 3600 * 10**9


@dataclass
class RemediationBudget:
    max_per_window: int = 2
    window_ns: int = HOUR_NS
    clock_ns: Callable[[], int] = time.monotonic_ns   # processing time; tests inject their own
    granted: deque[int] = field(default_factory=deque)   # clock times of the replacements let through
    withheld: int = 0                                     # replacements held for a human

    def allow(self) -> bool:
        """True (and counted) if a replacement now fits in the budget."""
        now = self.clock_ns()
        while self.granted and self.granted[0] <= now - self.window_ns:
            self.granted.popleft()
        if len(self.granted) < self.max_per_window:
            self.granted.append(now)
            return True
        self.withheld += 1
        return False
