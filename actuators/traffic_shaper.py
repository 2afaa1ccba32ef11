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
    """Every method is idempotent and thread-safe, and returns what was done in words.

    Limits are held per `holder` (the congested link's receiver, `toward` in the command): the low class gets the
    smallest share any holder asks, so one link's `resume` does not lift a limit another link still needs, and a
    `rate_limit` does not undo another's `pause`. Once no holder is left, shaping is removed."""

    def limit(self, share: float, holder: str) -> str:
        """Cap the low class to `share` of each shaped link (0: a trickle) for `holder`, the high class first."""
        ...

    def resume(self, holder: str) -> str:
        """Drop `holder`'s limit; with none left, remove the shaping."""
        ...

    def low_share(self) -> float | None:
        """The low class's cap now (1.0 = none), or None where nothing was shaped yet."""
        ...

    def leftover(self) -> bool:
        """Whether shaping of this shaper's own is in place already, left by an actuator that stopped before
        lifting it (its holders and their leases are unknown now)."""
        ...


class Holders:
    """The limits held on a node's low class, by holder: the shaper applies the smallest."""

    def __init__(self) -> None:
        self.shares: dict[str, float] = {}

    def hold(self, holder: str, share: float) -> float:
        self.shares[holder] = share
        return min(self.shares.values())

    def release(self, holder: str) -> float | None:
        """The share still to apply, or None when no limit is held."""
        self.shares.pop(holder, None)
        return min(self.shares.values()) if self.shares else None
