"""A fixed Ed25519 key pair for tests: signatures are deterministic, so runs compare command for command."""

from __future__ import annotations

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from clocktower.control import keys
from clocktower.control.keys import public_pem
from clocktower.control.signing import CommandSigner, CommandVerifier
from clocktower.schemas.control import ControlCommand

_KEY = Ed25519PrivateKey.from_private_bytes(b"clocktower-test-control-key-32b!")
TEST_SIGNER = CommandSigner(_KEY)
TEST_VERIFIER = CommandVerifier(_KEY.public_key())
TEST_PUBLIC_PEM = public_pem(_KEY)


def private_pem() -> bytes:
    return keys.private_pem(_KEY)


def resigned(cmd: ControlCommand) -> ControlCommand:
    """`cmd` signed with the test key as it is: for commands the issuer would never make (valid for too long)."""
    return cmd.model_copy(update={"signature": TEST_SIGNER.signature_of(cmd.model_copy(update={"signature": "-"}))})
