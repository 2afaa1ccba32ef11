"""A FlowRedirector that only remembers: the demo's simulated nodes (each has an alternate port), and tests."""

from __future__ import annotations

import threading

from clocktower.actuators.flow_redirector import FlowRedirector, Held, NoAlternatePath


class SimulatedRedirector(FlowRedirector):
    def __init__(self, alternate: str | None = "alternate port") -> None:
        """`alternate`: the port redirected traffic leaves by; None: this node has no alternate path."""
        self.alternate = alternate
        self._where: dict[str, str] = {}
        self._held = Held()
        self._lock = threading.Lock()

    def redirect(self, destinations: list[str], holder: str, source: str | None = None) -> str:
        if self.alternate is None:
            raise NoAlternatePath("this node has no alternate path")
        with self._lock:
            self._held.hold(holder, set(destinations))
            for d in destinations:
                self._where[d] = self.alternate
        return f"low class toward {', '.join(destinations)} moved to the {self.alternate} (simulated)"

    def release(self, holder: str) -> str:
        with self._lock:
            back = self._held.release(holder)
            for d in back:
                self._where.pop(d, None)
        return f"low class toward {', '.join(sorted(back))} back on its routed port" if back else "nothing redirected"

    def redirected(self) -> dict[str, str]:
        with self._lock:
            return dict(self._where)

    def close(self) -> None:
        with self._lock:
            self._where.clear()
            self._held = Held()
