"""What slowing a traffic class on a node's egress means, whatever does it (kernel HTB or a simulation).

Both backends (`kernel_shaper.KernelShaper`, `simulated_shaper.SimulatedShaper`) implement `TrafficShaper`; the
actuator applies the pipeline's `rate_limit`, `pause` and `resume` commands through it (control/traffic_class.py).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


class ShapingError(Exception):
    """Shaping failed; the message says why in one line (it becomes an ack's `detail`)."""


@runtime_checkable
class TrafficShaper(Protocol):
    """Every method is idempotent and thread-safe, and returns what was done in words."""

    def limit(self, share: float) -> str:
        """Cap the low class to `share` of each shaped link (0: a trickle), the high class served first."""
        ...

    def resume(self) -> str:
        """Give the low class the whole link again (the high class is still served first)."""
        ...

    def low_share(self) -> float | None:
        """The low class's cap now (1.0 = none), or None where nothing was shaped yet."""
        ...
