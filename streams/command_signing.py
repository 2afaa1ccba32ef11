"""Signed control commands: HMAC-SHA256 over every field but the signature.

Actuators recompute the HMAC with the shared key and refuse a command whose
signature, node, expiry or id (replay) does not check out.
"""

from __future__ import annotations

import hashlib
import hmac

import orjson

from clocktower.schemas.control import Action, ControlCommand
from clocktower.streams.ids import stable_id


def _canonical(cmd: ControlCommand) -> bytes:
    body = cmd.model_dump(exclude={"signature"})
    return orjson.dumps(body, option=orjson.OPT_SORT_KEYS)


def signature_of(cmd: ControlCommand, key: bytes) -> str:
    return hmac.new(key, _canonical(cmd), hashlib.sha256).hexdigest()


def verify(cmd: ControlCommand, key: bytes) -> bool:
    return hmac.compare_digest(cmd.signature, signature_of(cmd, key))


class CommandIssuer:
    """Builds signed commands with a deterministic id, so a replayed detector re-issues the same one."""

    def __init__(self, key: bytes, ttl_ns: int = 60 * 10**9) -> None:
        if not key:
            raise ValueError("control signing key is empty")
        self.key = key
        self.ttl_ns = ttl_ns

    def issue(self, node: str, action: Action, target: str, ts_ns: int, incident_id: str = "",
              params: dict[str, str] | None = None) -> ControlCommand:
        unsigned = ControlCommand(
            node=node, ts_ns=ts_ns, command_id=stable_id(action, incident_id or node, target, ts_ns),
            action=action, target=target, params=params or {}, incident_id=incident_id,
            expires_ns=ts_ns + self.ttl_ns, signature="-",
        )
        return unsigned.model_copy(update={"signature": signature_of(unsigned, self.key)})
