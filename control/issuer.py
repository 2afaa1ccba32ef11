"""Turns command intents into signed commands, with a deterministic id, so a replayed detector re-issues the same."""

from __future__ import annotations

from collections.abc import Iterable

from clocktower.control.intent import CommandIntent
from clocktower.control.signing import signature_of
from clocktower.schemas.control import ControlCommand
from clocktower.schemas.event import Event
from clocktower.schemas.ids import stable_id


class CommandIssuer:
    """Holds the control key: the only place outside the actuators that does."""

    def __init__(self, key: bytes, ttl_ns: int = 60 * 10**9) -> None:
        if not key:
            raise ValueError("control signing key is empty")
        self.key = key
        self.ttl_ns = ttl_ns

    def issue(self, intent: CommandIntent) -> ControlCommand:
        """The signed command for `intent`: valid for `ttl_ns` from the intent's event time."""
        i = intent
        unsigned = ControlCommand(
            node=i.node, ts_ns=i.ts_ns, command_id=stable_id(i.action, i.incident_id or i.node, i.target, i.ts_ns),
            action=i.action, target=i.target, params=dict(i.params), incident_id=i.incident_id,
            expires_ns=i.ts_ns + self.ttl_ns, signature="-",
        )
        return unsigned.model_copy(update={"signature": signature_of(unsigned, self.key)})

    def signed(self, derived: Iterable[Event | CommandIntent]) -> list[Event]:
        """`derived` with every intent replaced by its signed command, in order: the streams' edge step."""
        return [self.issue(e) if isinstance(e, CommandIntent) else e for e in derived]
