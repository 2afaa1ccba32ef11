"""A fleet-wide budget for disruptive remediation (drain + spare), in event time.

A forged or buggy stream of fatal GPU faults must not drain the fleet: at most
`max_per_window` replacements run per `window_ns` without a human; the rest are
held as "needs human approval" and counted. The budget lives in one worker; with
several stream workers each holds its own, so the fleet-wide limit is N x workers.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

HOUR_NS = 3600 * 10**9


@dataclass
class RemediationBudget:
    max_per_window: int = 2
    window_ns: int = HOUR_NS
    granted: deque[int] = field(default_factory=deque)   # event times of the replacements let through
    withheld: int = 0                                     # replacements held for a human

    def allow(self, ts_ns: int) -> bool:
        """True (and counted) if a replacement at event time `ts_ns` fits in the budget."""
        while self.granted and self.granted[0] <= ts_ns - self.window_ns:
            self.granted.popleft()
        if len(self.granted) < self.max_per_window:
            self.granted.append(ts_ns)
            return True
        self.withheld += 1
        return False
