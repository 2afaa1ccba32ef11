"""Link-flap detection: open an incident and fail over; restore once stable.

A port that changes carrier at least `min_transitions` times within
`window_ns` is flapping. The detector opens a `link_flap` incident and asks
the node to fail traffic over to the backup port. Once the port has been up
with no carrier change for `stable_ns`, it resolves the incident and asks
for a restore. Time is the event time of the node's own reports.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from clocktower.control.intent import CommandIntent
from clocktower.schemas.analytics import Incident
from clocktower.schemas.ids import bounded_name, stable_id
from clocktower.schemas.telemetry import LinkState

DEFAULT_BACKUPS = {"eth0": "eth1", "ib0": "ib1"}


@dataclass
class _Port:
    up: bool
    carrier_changes: int
    changes: deque[int] = field(default_factory=deque)
    last_change_ns: int = 0
    incident_id: str | None = None
    opened_ns: int = 0


class LinkFlapDetector:
    """Returns incidents and unsigned command intents; the streams' edge signs the intents."""

    def __init__(self, *, window_ns: int = 10 * 10**9, min_transitions: int = 3,
                 stable_ns: int = 5 * 10**9, backups: dict[str, str] | None = None) -> None:
        self.window_ns = window_ns
        self.min_transitions = min_transitions
        self.stable_ns = stable_ns
        self.backups = backups or DEFAULT_BACKUPS
        self.ports: dict[tuple[str, str], _Port] = {}

    def on_link_state(self, ev: LinkState) -> list[Incident | CommandIntent]:
        key = (ev.node, ev.interface)
        port = self.ports.get(key)
        if port is None:
            self.ports[key] = _Port(up=ev.up, carrier_changes=ev.carrier_changes)
            return []
        # Count changes the counter saw even between two reports; a state change
        # with a reset counter (agent restart) still counts as one.
        delta = ev.carrier_changes - port.carrier_changes if ev.carrier_changes >= port.carrier_changes else 1
        delta = max(delta, 1 if ev.up != port.up else 0)
        port.up, port.carrier_changes = ev.up, ev.carrier_changes
        if delta:
            port.changes.extend([ev.ts_ns] * min(delta, 1000))
            port.last_change_ns = ev.ts_ns
        while port.changes and port.changes[0] < ev.ts_ns - self.window_ns:
            port.changes.popleft()
        if port.incident_id is None and len(port.changes) >= self.min_transitions:
            return self._open(ev, port)
        if port.incident_id is not None and port.up and ev.ts_ns - port.last_change_ns >= self.stable_ns:
            return self._resolve(ev, port)
        return []

    def _incident(self, ev: LinkState, port: _Port, state: str, severity: str, detail: str) -> Incident:
        return Incident(node=ev.node, ts_ns=ev.ts_ns, incident_id=port.incident_id or "", kind="link_flap",
                        state=state, severity=severity, target=bounded_name(f"{ev.node}/{ev.interface}"),
                        opened_ns=port.opened_ns, detail=detail)

    def _open(self, ev: LinkState, port: _Port) -> list[Incident | CommandIntent]:
        port.incident_id = stable_id("link_flap", ev.node, ev.interface, ev.ts_ns)
        port.opened_ns = ev.ts_ns
        n = len(port.changes)
        backup = self.backups.get(ev.interface, "")
        return [
            self._incident(ev, port, "open", "critical",
                           f"{n} carrier changes within {self.window_ns / 1e9:g} s"),
            CommandIntent(ev.node, "failover", ev.interface, ev.ts_ns, port.incident_id,
                          {"from": ev.interface, "to": backup}),
        ]

    def _resolve(self, ev: LinkState, port: _Port) -> list[Incident | CommandIntent]:
        out: list[Incident | CommandIntent] = [
            self._incident(ev, port, "resolve", "info",
                           f"stable for {(ev.ts_ns - port.last_change_ns) / 1e9:.1f} s"),
            CommandIntent(ev.node, "restore", ev.interface, ev.ts_ns, port.incident_id or "",
                          {"from": self.backups.get(ev.interface, ""), "to": ev.interface}),
        ]
        port.incident_id = None
        port.changes.clear()
        return out
