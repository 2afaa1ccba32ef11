"""Ed25519 signatures over every field of a control command but the signature.

Signing needs the private key, which only the streams and the operator's CLI hold; checking needs only the public
key, which is all an actuator gets. So no node can forge a command, for itself or for another node (the HMAC
this replaces let every holder of the shared key do both). The signed bytes are the command's fields as sorted
JSON, so any change to any field (node, expiry, id, params) breaks the signature.
"""

from __future__ import annotations

import base64
import binascii

import orjson
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from clocktower.schemas.control import ControlCommand


def signed_bytes(cmd: ControlCommand) -> bytes:
    """What the signature covers: every field but `signature`, as JSON with sorted keys."""
    return orjson.dumps(cmd.model_dump(exclude={"signature"}), option=orjson.OPT_SORT_KEYS)


class CommandSigner:
    """Holds the private key: signs commands."""

    def __init__(self, key: Ed25519PrivateKey) -> None:
        self.key = key

    def signature_of(self, cmd: ControlCommand) -> str:
        """The base64url (unpadded) Ed25519 signature of `cmd`: 86 characters."""
        return base64.urlsafe_b64encode(self.key.sign(signed_bytes(cmd))).rstrip(b"=").decode()

    def verifier(self) -> CommandVerifier:
        return CommandVerifier(self.key.public_key())


class CommandVerifier:
    """Holds only the public key: checks signatures, and cannot make one."""

    def __init__(self, key: Ed25519PublicKey) -> None:
        self.key = key

    def verify(self, cmd: ControlCommand) -> bool:
        """Whether `cmd.signature` is the controller's signature of exactly this command."""
        sig = cmd.signature
        if len(sig) != 86:
            return False
        try:
            raw = base64.urlsafe_b64decode(sig + "==")
            self.key.verify(raw, signed_bytes(cmd))
        except (InvalidSignature, binascii.Error, ValueError):
            return False
        return True
