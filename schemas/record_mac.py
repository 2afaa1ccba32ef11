"""Proof that a record comes from the node it is keyed by: a per-node HMAC in the `ct-node-mac` header.

Kafka tells consumers nothing about who produced a record, so a SASL login alone cannot
stop one node (or anyone who can produce) from speaking for another. Each node holds only
its own key, derived from the cluster's producer key: HMAC-SHA256(producer_key, node).
The streams hold the producer key, derive the key of the node a record claims, and check
the MAC over topic, key, schema and value. It proves origin, not freshness: a recorded
genuine record can be replayed (the detectors act once per GPU or port state change).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import stat
from collections.abc import Sequence
from pathlib import Path

from pydantic import SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

H_NODE_MAC = "ct-node-mac"
NODE_KEY_HEX_CHARS = 64       # node_key() is an HMAC-SHA256 digest: 32 bytes
MIN_PRODUCER_KEY_CHARS = 32
_H_SCHEMA = "ct-schema"   # as in schemas/codec.py
_H_VERSION = "ct-version"


def node_key(producer_key: bytes, node: str) -> bytes:
    """The key one node signs its records with; it cannot sign for any other node."""
    return hmac.new(producer_key, b"clocktower-node-key\x00" + node.encode(), hashlib.sha256).digest()


def _header(headers: Sequence[tuple[str, bytes | None]], name: str) -> bytes:
    return next((v or b"" for k, v in headers if k == name), b"")


def record_mac(key_for_node: bytes, topic: str, key: bytes, value: bytes,
               headers: Sequence[tuple[str, bytes | None]]) -> bytes:
    msg = b"\x00".join([topic.encode(), key, _header(headers, _H_SCHEMA), _header(headers, _H_VERSION),
                        hashlib.sha256(value).digest()])
    return hmac.new(key_for_node, msg, hashlib.sha256).hexdigest().encode()


def sign(key_for_node: bytes, topic: str, key: bytes, value: bytes,
         headers: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    """`headers` plus the node MAC."""
    return [*headers, (H_NODE_MAC, record_mac(key_for_node, topic, key, value, headers))]


def check(producer_key: bytes, topic: str, key: bytes | None, value: bytes | None,
          headers: Sequence[tuple[str, bytes | None]]) -> str | None:
    """None if the record is signed by the node it is keyed by, else why not."""
    mac = _header(headers, H_NODE_MAC)
    if not mac:
        return f"record is not signed ({H_NODE_MAC} header missing)"
    if not key:
        return "record has no key (node)"
    want = record_mac(node_key(producer_key, key.decode("utf-8", "replace")), topic, key, value or b"", headers)
    if not hmac.compare_digest(mac, want):
        return f"{H_NODE_MAC} does not match the key's node: signed by another node, or altered"
    return None


def node_mac_status(producer_key: bytes | None, topic: str, key: bytes | None, value: bytes | None,
                    headers: Sequence[tuple[str, bytes | None]], signed_topics: frozenset[str]) -> str:
    """What the sink writes in a row's `_node_mac`: `valid`, `none`, `invalid`, or `unchecked` (no producer key, or
    a topic in which nodes sign nothing)."""
    if producer_key is None or topic not in signed_topics:
        return "unchecked"
    if not any(k == H_NODE_MAC for k, _ in headers):
        return "none"
    return "valid" if check(producer_key, topic, key, value, headers) is None else "invalid"


def read_producer_key_file(path: Path) -> str:
    """The producer key in `path`: a regular file of this user's, readable by no one else (a symlink is refused)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise ValueError(f"CLOCKTOWER_PRODUCER_KEY_FILE {path}: cannot open it ({exc.strerror})") from None
    try:
        st = os.fstat(fd)
        owner_ok = st.st_uid == os.geteuid() or os.geteuid() == 0   # root: an agent as root beside a user's `up`
        if not stat.S_ISREG(st.st_mode) or not owner_ok or st.st_mode & 0o077:
            raise ValueError(f"CLOCKTOWER_PRODUCER_KEY_FILE {path}: must be a file of this user's that no one else "
                             f"can read or write (mode {stat.filemode(st.st_mode)}, owner uid {st.st_uid})")
        return os.read(fd, 4096).decode("utf-8", "replace").strip()
    finally:
        os.close(fd)


class NodeSigning(BaseSettings):
    """CLOCKTOWER_NODE_KEY on a node (hex, from `node_key`); CLOCKTOWER_PRODUCER_KEY where records are checked.

    The producer key may come from a file instead, CLOCKTOWER_PRODUCER_KEY_FILE: `clocktower up` and `demo` write one
    into the data dir (producer.key) and name it to the processes they start.

    Both are checked when the settings are read, so a malformed key is a clear configuration error at start
    (never a raw ValueError when the publisher is built), and an empty or short producer key never turns the
    check off or weakens it silently. Errors never echo a key.
    """

    model_config = SettingsConfigDict(env_prefix="CLOCKTOWER_", extra="ignore", hide_input_in_errors=True)

    node_key: SecretStr | None = None
    producer_key: SecretStr | None = None
    producer_key_file: Path | None = None

    @field_validator("node_key")
    @classmethod
    def _node_key_is_hex(cls, v: SecretStr | None) -> SecretStr | None:
        if v is None:
            return None
        text = v.get_secret_value().strip()
        try:
            raw = bytes.fromhex(text)
        except ValueError:
            raw = None
        if raw is None or len(text) != NODE_KEY_HEX_CHARS:
            raise ValueError(f"CLOCKTOWER_NODE_KEY must be {NODE_KEY_HEX_CHARS} hex characters (the output of "
                             f"`python -m clocktower.schemas.record_mac NODE`), got {len(text)} characters"
                             + ("" if raw is not None or not text else " that are not all hex"))
        return SecretStr(text)

    @field_validator("producer_key")
    @classmethod
    def _producer_key_is_long_enough(cls, v: SecretStr | None) -> SecretStr | None:
        if v is None:
            return None
        n = len(v.get_secret_value().encode())
        if n < MIN_PRODUCER_KEY_CHARS:
            raise ValueError(f"CLOCKTOWER_PRODUCER_KEY must be at least {MIN_PRODUCER_KEY_CHARS} characters, got "
                             f"{n}; unset it to turn the producer check off (e.g. `openssl rand -hex 32`)")
        return v

    @model_validator(mode="after")
    def _key_from_file(self) -> NodeSigning:
        if self.producer_key is None and self.producer_key_file is not None:
            text = read_producer_key_file(self.producer_key_file)
            if len(text.encode()) < MIN_PRODUCER_KEY_CHARS:
                raise ValueError(f"CLOCKTOWER_PRODUCER_KEY_FILE {self.producer_key_file}: the key must be at least "
                                 f"{MIN_PRODUCER_KEY_CHARS} characters, got {len(text.encode())}")
            self.producer_key = SecretStr(text)
        return self

    def node_key_bytes(self) -> bytes | None:
        return bytes.fromhex(self.node_key.get_secret_value()) if self.node_key is not None else None

    def producer_key_bytes(self) -> bytes | None:
        return self.producer_key.get_secret_value().encode() if self.producer_key is not None else None


if __name__ == "__main__":   # `python -m clocktower.schemas.record_mac NODE`: the CLOCKTOWER_NODE_KEY to give that node
    import sys

    producer_key = NodeSigning().producer_key_bytes()
    if producer_key is None or len(sys.argv) != 2:
        sys.exit("usage: CLOCKTOWER_PRODUCER_KEY=... python -m clocktower.schemas.record_mac NODE")
    print(node_key(producer_key, sys.argv[1]).hex())
