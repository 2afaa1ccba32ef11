"""A fleet-wide budget for disruptive remediation (drain + spare), in processing time.

A forged or buggy stream of fatal GPU faults must not drain the fleet: at most `max_per_window`
replacements run per `window_ns` without a human; the rest are withheld and counted, and the allocator asks again
for them when the window allows, while their fault is recent enough (streams/detectors/replacement_allocator.py).
The window runs on the processing clock of the worker that decides (its wall clock), never on event time:
event times are written by the producers, so forged timestamps spread an hour apart would each find an
empty window, and one dated far in the future would hold the budget shut against real faults.

The grants themselves are kept by the caller: the replacement allocator keeps them in its table
(streams/detectors/replacement_allocator.py), under one key for the whole fleet, so the limit holds
across all workers and survives a restart. A wall clock stepped forward ends the window early; one
stepped back keeps grants counted longer (never fewer replacements held than the limit says).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

HOUR_NS = 3600 * 10**9


@dataclass
class RemediationBudget:
    max_per_window: int = 2
    window_ns: int = HOUR_NS
    clock_ns: Callable[[], int] = time.time_ns   # processing time; tests inject their own
    withheld: int = 0                            # replacements held for a human (this worker's count, a metric)

    def allow(self, granted: list[int], count_withheld: bool = True) -> bool:
        """True if a replacement now fits in the budget, whose earlier grants (clock times) are `granted`;
        drops the grants that left the window and, if allowed, adds this one. A retry of a withheld request
        passes `count_withheld=False`: it was counted when first withheld."""
        now = self.clock_ns()
        granted[:] = [t for t in granted if t > now - self.window_ns]
        if len(granted) < self.max_per_window:
            granted.append(now)
            return True
        self.withheld += count_withheld
        return False
