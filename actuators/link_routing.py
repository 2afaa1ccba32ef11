"""What moving a link's traffic to its backup port means, whatever does it (kernel routes or a simulation).

Both backends (`route_table.KernelRouting`, `simulated_routing.SimulatedRouting`) implement `LinkRouting`.
The local watchdog fails a link over by itself; the actuator applies the pipeline's `failover`/`restore`
commands through the same object, so both paths share one idempotent implementation.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


class RoutingError(Exception):
    """Moving routes failed; the message says why in one line (it becomes an ack's `detail`)."""


@runtime_checkable
class LinkRouting(Protocol):
    """Move a link's routes to its backup port and back. Every method is idempotent and thread-safe."""

    def remember(self, link: str, backup: str) -> str:
        """Record the routes `link` carries now (and get ready to move them to `backup`), so a failover after
        an admin-down (which deletes them) can still move them, without first reading anything. Never forgets
        known routes because `link` carries none at the moment."""
        ...

    def fail_over(self, link: str, backup: str) -> str:
        """Move `link`'s routes to `backup`; returns what was done ("moved 2 routes to eth1",
        "already on eth1"); raises RoutingError with the reason."""
        ...

    def restore(self, link: str, backup: str) -> str:
        """Move them back onto `link`, re-adding those an admin-down deleted; "already on eth0" if nothing
        to do; raises RoutingError (e.g. `link` still down)."""
        ...

    def on_backup(self, link: str) -> bool:
        """Whether `link`'s traffic is on its backup now (as far as this backend knows)."""
        ...
