"""Link-flap detection: open an incident and fail over; restore once stable.

A port that changes carrier at least `min_transitions` times within `window_ns` is flapping: the detector
opens a `link_flap` incident and asks the node to fail traffic over to the backup port. Once the port has
been up with no carrier change for `stable_ns`, it resolves the incident and asks for a restore. Time is the
event time of the node's own reports.

Keyed by node (the records' own key); one state entry per port, "node|interface", which expires `ttl_ns` of
event time after the port's newest report (default 24 h; an open incident then is never resolved, and is
counted in `expired_open`). A redelivered report is not applied again and re-emits what it emitted
(delivery_log.py); those are counted in `redelivered`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from clocktower.control.intent import CommandIntent
from clocktower.schemas.analytics import Incident
from clocktower.schemas.event import Event
from clocktower.schemas.ids import bounded_name, stable_id
from clocktower.schemas.telemetry import LinkState
from clocktower.streams.detectors.delivery_log import DeliveryLog, Emitted
from clocktower.streams.detectors.replaying_detector import ReplayingDetector
from clocktower.streams.processor import Output, compound_key

DEFAULT_BACKUPS = {"eth0": "eth1", "ib0": "ib1"}
DEFAULT_PORT_TTL_NS = 24 * 3600 * 10**9
MAX_CHANGES_PER_REPORT = 1000   # a counter jump larger than this (a reset misread) counts as this many


@dataclass
class Port:
    up: bool
    carrier_changes: int
    changes: list[list[int]] = field(default_factory=list)   # [ts_ns, count] of carrier changes in the window
    last_change_ns: int = 0
    incident_id: str | None = None
    opened_ns: int = 0
    log: DeliveryLog = field(default_factory=DeliveryLog)

    @property
    def recent_changes(self) -> int:
        return sum(n for _, n in self.changes)


class LinkFlapDetector(ReplayingDetector):
    """Returns incidents and unsigned command intents; the streams' edge signs the intents."""

    name: ClassVar[str] = "link_flap"
    consumes: ClassVar[tuple[type[Event], ...]] = (LinkState,)
    key_by: ClassVar[str] = "node"
    entry: ClassVar[type] = Port

    def __init__(self, *, window_ns: int = 10 * 10**9, min_transitions: int = 3, stable_ns: int = 5 * 10**9,
                 backups: dict[str, str] | None = None, ttl_ns: int = DEFAULT_PORT_TTL_NS) -> None:
        super().__init__(ttl_ns)
        self.window_ns = window_ns
        self.min_transitions = min_transitions
        self.stable_ns = stable_ns
        self.backups = backups or DEFAULT_BACKUPS

    def is_open(self, entry: Port) -> bool:
        return entry.incident_id is not None

    def process(self, state: Any, event: Event) -> list[Output]:
        assert isinstance(event, LinkState)
        key = compound_key(event.node, event.interface)
        port: Port | None = state.get(key)
        out: Emitted = []
        if port is None:
            port = Port(up=event.up, carrier_changes=event.carrier_changes)
        elif port.log.was_applied(event.ts_ns):
            self.redelivered += 1
            return list(port.log.outputs_of(event.ts_ns))
        else:
            out = self._apply(port, event)
        port.log.applied(event.ts_ns, out)
        state.put(key, port, port.log.newest + self.state_ttl_ns)
        return list(out)

    def _apply(self, port: Port, ev: LinkState) -> Emitted:
        # Count changes the counter saw even between two reports; a state change
        # with a reset counter (agent restart) still counts as one.
        delta = ev.carrier_changes - port.carrier_changes if ev.carrier_changes >= port.carrier_changes else 1
        delta = max(delta, 1 if ev.up != port.up else 0)
        port.up, port.carrier_changes = ev.up, ev.carrier_changes
        if delta:
            port.changes.append([ev.ts_ns, min(delta, MAX_CHANGES_PER_REPORT)])
            port.last_change_ns = ev.ts_ns
        port.changes = [c for c in port.changes if c[0] >= ev.ts_ns - self.window_ns]
        if port.incident_id is None and port.recent_changes >= self.min_transitions:
            return self._open(ev, port)
        if port.incident_id is not None and port.up and ev.ts_ns - port.last_change_ns >= self.stable_ns:
            return self._resolve(ev, port)
        return []


    def _incident(self, ev: LinkState, port: Port, state: str, severity: str, detail: str) -> Incident:
        return Incident(node=ev.node, ts_ns=ev.ts_ns, incident_id=port.incident_id or "", kind="link_flap",
                        state=state, severity=severity, target=bounded_name(f"{ev.node}/{ev.interface}"),
                        opened_ns=port.opened_ns, detail=detail)

    def _open(self, ev: LinkState, port: Port) -> Emitted:
        port.incident_id = stable_id("link_flap", ev.node, ev.interface, ev.ts_ns)
        port.opened_ns = ev.ts_ns
        backup = self.backups.get(ev.interface, "")
        return [
            self._incident(ev, port, "open", "critical",
                           f"{port.recent_changes} carrier changes within {self.window_ns / 1e9:g} s"),
            CommandIntent(ev.node, "failover", ev.interface, ev.ts_ns, port.incident_id,
                          {"from": ev.interface, "to": backup}),
        ]

    def _resolve(self, ev: LinkState, port: Port) -> Emitted:
        out: Emitted = [
            self._incident(ev, port, "resolve", "info",
                           f"stable for {(ev.ts_ns - port.last_change_ns) / 1e9:.1f} s"),
            CommandIntent(ev.node, "restore", ev.interface, ev.ts_ns, port.incident_id or "",
                          {"from": self.backups.get(ev.interface, ""), "to": ev.interface}),
        ]
        port.incident_id = None
        port.changes.clear()
        return out
