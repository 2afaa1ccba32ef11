"""What processors are built from: settings values and the shared objects of one worker.

Each processor picks what it needs in `Processor.from_context`, so the registry is a plain list of classes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from clocktower.streams.remediation_budget import RemediationBudget


@dataclass
class ProcessorContext:
    clocks: Any = None                      # ClockCorrection for the flow join: the worker's ClockView
    clock_pure_tolerance_ns: float = 2_000.0
    clock_update_ns: int = 250_000_000
    segment_ttl_ns: int = 10 * 10**9
    remediation_budget: RemediationBudget = field(default_factory=RemediationBudget)
