"""HMAC-SHA256 over every field of a control command but the signature.

Actuators recompute the HMAC with the shared key and refuse a command whose
signature, node, expiry or id (replay) does not check out.
"""

from __future__ import annotations

import hashlib
import hmac

import orjson

from clocktower.schemas.control import ControlCommand


def _canonical(cmd: ControlCommand) -> bytes:
    body = cmd.model_dump(exclude={"signature"})
    return orjson.dumps(body, option=orjson.OPT_SORT_KEYS)


def signature_of(cmd: ControlCommand, key: bytes) -> str:
    return hmac.new(key, _canonical(cmd), hashlib.sha256).hexdigest()


def verify(cmd: ControlCommand, key: bytes) -> bool:
    return hmac.compare_digest(cmd.signature, signature_of(cmd, key))
