"""What a detector asks a node to do, before anyone signs it.

A detector returns intents, not commands, so it holds no key and is tested without one;
the one issuer at the streams' edge gives each intent its id, expiry and signature.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from clocktower.schemas.control import Action
from clocktower.schemas.ids import stable_id


@dataclass(frozen=True)
class CommandIntent:
    """A command's content: the fields of `ControlCommand` except `command_id`, `expires_ns` and `signature`."""

    node: str
    action: Action
    target: str
    ts_ns: int
    incident_id: str = ""
    params: dict[str, str] = field(default_factory=dict)


def command_id_of(intent: CommandIntent) -> str:
    """The id the issuer gives `intent`'s command: a detector computes it too, to name it in its incident."""
    return stable_id(intent.action, intent.incident_id or intent.node, intent.target, intent.ts_ns)
