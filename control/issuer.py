"""Turns command intents into signed commands, with a deterministic id, so a replayed detector re-issues the same."""

from __future__ import annotations

from collections.abc import Iterable

from clocktower.control.intent import CommandIntent, command_id_of
from clocktower.control.signing import CommandSigner
from clocktower.schemas.control import ControlCommand
from clocktower.schemas.event import Event

DEFAULT_TTL_NS = 60 * 10**9


class CommandIssuer:
    """Holds the private control key: with the operator's CLI, the only place that does."""

    def __init__(self, signer: CommandSigner, ttl_ns: int = DEFAULT_TTL_NS) -> None:
        self.signer = signer
        self.ttl_ns = ttl_ns

    def issue(self, intent: CommandIntent) -> ControlCommand:
        """The signed command for `intent`: valid for `ttl_ns` from the intent's event time."""
        i = intent
        unsigned = ControlCommand(
            node=i.node, ts_ns=i.ts_ns, command_id=command_id_of(i), action=i.action, target=i.target,
            params=dict(i.params), incident_id=i.incident_id, expires_ns=i.ts_ns + self.ttl_ns, signature="-",
        )
        return unsigned.model_copy(update={"signature": self.signer.signature_of(unsigned)})

    def signed(self, derived: Iterable[Event | CommandIntent]) -> list[Event]:
        """`derived` with every intent replaced by its signed command, in order: the streams' edge step."""
        return [self.issue(e) if isinstance(e, CommandIntent) else e for e in derived]
