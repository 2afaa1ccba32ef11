"""Ed25519 key pairs for control commands: PEM files (PKCS#8 private, SubjectPublicKeyInfo public).

The private key signs (the streams, the operator's CLI) and never leaves the controller; actuators get only the
public key, so a node that can check a command cannot make one. Keys are plain PEM so `openssl pkey` reads them.
"""

from __future__ import annotations

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey


class BadKeyFile(ValueError):
    """A key file that holds no usable Ed25519 key; the message names the file and what is wrong."""


def new_key_pair() -> tuple[bytes, bytes]:
    """(private PEM, public PEM) of a fresh key pair."""
    key = Ed25519PrivateKey.generate()
    return private_pem(key), public_pem(key)


def private_pem(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def public_pem(key: Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def load_private_key(pem: bytes, origin: str) -> Ed25519PrivateKey:
    """The private key in `pem`; BadKeyFile naming `origin` when it is not an unencrypted Ed25519 PEM key."""
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise BadKeyFile(f"{origin} is not an unencrypted PEM private key ({exc})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise BadKeyFile(f"{origin} holds a {type(key).__name__}, not an Ed25519 key")
    return key


def load_public_key(pem: bytes, origin: str) -> Ed25519PublicKey:
    """The public key in `pem`; BadKeyFile naming `origin` when it is not an Ed25519 PEM public key."""
    try:
        key = serialization.load_pem_public_key(pem)
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise BadKeyFile(f"{origin} is not a PEM public key ({exc})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise BadKeyFile(f"{origin} holds a {type(key).__name__}, not an Ed25519 key")
    return key
