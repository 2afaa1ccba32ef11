"""In-memory LinkRouting for the demo's simulated nodes and for unit tests: the same semantics, no kernel.

Each link is either on its primary port or on one backup. `set_link_up(link, False)` makes a restore of
that link fail the way the kernel's does (routes cannot go onto a down port), so callers see the same
errors in the demo as on a real node.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from clocktower.actuators.link_routing import RoutingError


class SimulatedRouting:
    """Thread-safe in-memory LinkRouting; `interfaces` (None = any name) lists the ports that exist."""

    def __init__(self, interfaces: Iterable[str] | None = None) -> None:
        self.interfaces = frozenset(interfaces) if interfaces is not None else None
        self.history: list[tuple[str, str, str]] = []    # (operation, link, backup) of every change made
        self._on: dict[str, str] = {}                     # link -> the backup carrying its traffic
        self._down: set[str] = set()
        self._lock = threading.Lock()

    def _check(self, *names: str) -> None:
        for name in names:
            if not name:
                raise RoutingError("no interface named (empty name)")
            if self.interfaces is not None and name not in self.interfaces:
                raise RoutingError(f"no interface {name!r} on this node")

    def set_link_up(self, link: str, up: bool) -> None:
        """Simulate the port's admin/carrier state (a restore onto a down port fails)."""
        with self._lock:
            (self._down.discard if up else self._down.add)(link)

    def remember(self, link: str, backup: str) -> str:
        self._check(link, backup)
        return f"remembered the routes of {link}"

    def fail_over(self, link: str, backup: str) -> str:
        self._check(link, backup)
        if link == backup:
            raise RoutingError(f"{link} cannot be its own backup")
        with self._lock:
            if backup in self._down:
                raise RoutingError(f"backup {backup} is down")
            if self._on.get(link) == backup:
                return f"already on {backup}"
            self._on[link] = backup
            self.history.append(("fail_over", link, backup))
        return f"moved the routes of {link} to {backup}"

    def restore(self, link: str, backup: str) -> str:
        self._check(link, backup)
        with self._lock:
            if link not in self._on:
                return f"already on {link}"
            if link in self._down:
                raise RoutingError(f"{link} is down: its routes cannot go back onto it")
            del self._on[link]
            self.history.append(("restore", link, backup))
        return f"moved the routes of {link} back from {backup}"

    def on_backup(self, link: str) -> bool:
        with self._lock:
            return link in self._on
