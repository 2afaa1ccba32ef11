"""What moving the low traffic class toward a destination onto another port means, whatever does it.

Both backends (`kernel_redirector.KernelRedirector`, `simulated_redirector.SimulatedRedirector`) implement
`FlowRedirector`; the actuator applies the pipeline's `redirect` command through it, and its `resume` ends it.
Only the low class (control/traffic_class.py) is moved: the collectives keep the path the routing chose, which is
the one whose queue the congestion detector measured. The alternate port of each port is the node's own
configuration (CLOCKTOWER_ACTUATOR_REDIRECT_PATHS), never a command's.
"""

from __future__ import annotations

import ipaddress
from typing import Protocol, runtime_checkable

MAX_DESTINATIONS = 16   # addresses one `redirect` command may name


class RedirectError(Exception):
    """Redirecting failed; the message says why in one line (it becomes an ack's `detail`)."""


class NoAlternatePath(RedirectError):
    """No destination named has an alternate path from this node: the caller may slow the low class instead."""


def parse_destinations(text: str) -> list[str]:
    """A `redirect` command's `dst` param: comma-separated IPv4/IPv6 addresses, at most MAX_DESTINATIONS."""
    items = [p.strip() for p in text.split(",") if p.strip()]
    if not items:
        raise ValueError("no destination address (params 'dst' is empty)")
    if len(items) > MAX_DESTINATIONS:
        raise ValueError(f"{len(items)} destinations; at most {MAX_DESTINATIONS}")
    return [_unicast(item, "destination", "of another node") for item in items]


def parse_source(text: str) -> str:
    """A `redirect` command's optional `src` param: exactly one IPv4/IPv6 address (this node's, on the path)."""
    items = [p.strip() for p in text.split(",") if p.strip()]
    if len(items) != 1:
        raise ValueError(f"params 'src' names {len(items)} addresses; a redirect takes exactly one source")
    return _unicast(items[0], "source", "of this node")


def _unicast(item: str, role: str, whose: str) -> str:
    try:
        address = ipaddress.ip_address(item)
    except ValueError:
        raise ValueError(f"{role} {item[:64]!r} is not an IP address") from None
    if isinstance(address, ipaddress.IPv6Address) and (address.scope_id or address.ipv4_mapped):
        raise ValueError(f"{role} {item[:64]!r}: give a plain address (no scope, no IPv4-mapped form)")
    if address.is_unspecified or address.is_multicast or address.is_loopback or address.is_link_local or \
            address == ipaddress.IPv4Address("255.255.255.255"):
        raise ValueError(f"{role} {address} is not a routed unicast address {whose}")
    return str(address)


@runtime_checkable
class FlowRedirector(Protocol):
    """Every method is idempotent and thread-safe, and returns what was done in words.

    Redirects are held per `holder` (the congested link's receiver, `toward` in the command), like the shaper's
    limits: a destination stays redirected while any holder holds it."""

    def redirect(self, destinations: list[str], holder: str, source: str | None = None) -> str:
        """Send the low class toward `destinations` out of the alternate port of the port each is routed through
        (from `source`, this node's address the flows leave from, where given: source-based routing picks the
        port by it). A destination with no alternate path now is no longer redirected. Raises NoAlternatePath
        when none of them has one (saying why for each), RedirectError on failure."""
        ...

    def release(self, holder: str) -> str:
        """Drop `holder`'s redirects; a destination no holder holds goes back to its routed port."""
        ...

    def redirected(self) -> dict[str, str]:
        """Destination address -> the port its low class leaves by now."""
        ...

    def close(self) -> None:
        """Remove every redirect (the node's routing decides again). Safe twice."""
        ...


class Held:
    """Which holders hold which destinations."""

    def __init__(self) -> None:
        self.by_holder: dict[str, set[str]] = {}

    def hold(self, holder: str, destinations: set[str]) -> None:
        self.by_holder[holder] = self.by_holder.get(holder, set()) | destinations

    def release(self, holder: str) -> set[str]:
        """The destinations no holder holds any longer."""
        dropped = self.by_holder.pop(holder, set())
        still = set().union(*self.by_holder.values()) if self.by_holder else set()
        return dropped - still

    def forget(self, destination: str) -> None:
        """`destination` is no longer redirected, whoever held it."""
        for held in self.by_holder.values():
            held.discard(destination)
