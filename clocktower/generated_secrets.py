"""Generating the data dir's secrets on first start: ClickHouse users and the control key pair.

There are no built-in passwords or keys. The first start writes random ones (0600, never overwritten);
every later process (the endpoint, the sink, the streams, `clocktower query`) reads them through
clocktower.runtime.credentials unless CLOCKTOWER_* settings name others.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
from pathlib import Path

from clocktower.control.keys import new_key_pair
from clocktower.runtime.credentials import (
    ADMIN_USER,
    DASHBOARDS_USER,
    control_key_path,
    control_public_key_path,
    credentials_path,
    producer_key_path,
)
from clocktower.runtime.private_file import create_private_file, private_dir

log = logging.getLogger(__name__)


def ensure_secrets(data_dir: Path, clickhouse_users: bool = True) -> None:
    """Generate the control key pair and (for the embedded endpoint) its users unless they exist; never overwrites."""
    private_dir(data_dir)
    ensure_control_keys(data_dir)
    if not clickhouse_users:
        return
    users = {
        ADMIN_USER: {"password": secrets.token_urlsafe(24), "readonly": False},
        DASHBOARDS_USER: {"password": secrets.token_urlsafe(24), "readonly": True},
    }
    create_private_file(credentials_path(data_dir), json.dumps({"users": users}, indent=2).encode() + b"\n")


def ensure_control_keys(directory: Path) -> bool:
    """Write an Ed25519 pair (control.key 0600, control.pub 0644) unless one is there; True when one was made.

    A control.key from before Ed25519 (a shared HMAC secret, not PEM) is kept aside as control.key.hmac-old and
    replaced: nothing may sign with it any more.
    """
    private, public = control_key_path(directory), control_public_key_path(directory)
    if private.exists() and not private.is_symlink() and not private.read_bytes().startswith(b"-----BEGIN"):
        private.rename(directory / "control.key.hmac-old")
        public.unlink(missing_ok=True)
        log.warning("%s held a shared HMAC key (before Ed25519): kept aside as control.key.hmac-old, replaced", private)
    if private.exists() or private.is_symlink():
        return False
    private_pem, public_pem = new_key_pair()
    public.unlink(missing_ok=True)    # a public key left without its private one matches nothing
    create_private_file(public, public_pem)
    os.chmod(public, 0o644)
    create_private_file(private, private_pem)   # last: its presence says the pair is complete
    return True


def ensure_producer_key(data_dir: Path) -> Path:
    """Write a random producer key (producer.key, 0600, 64 hex characters) unless one is there; its path.

    With it, the streams act only on records signed by the node they are keyed by (schemas/record_mac.py); every
    publisher that `up` and `demo` start signs with it, or with a node key derived from it."""
    path = producer_key_path(data_dir)
    if os.path.lexists(path):
        return path                       # kept (a planted or unfit one is refused where it is read)
    tmp = data_dir / f".producer.key.{secrets.token_hex(8)}"
    create_private_file(tmp, secrets.token_hex(32).encode() + b"\n")   # written and synced first
    try:
        os.link(tmp, path)                # appears whole or not at all; a file made meanwhile stays
    except FileExistsError:
        pass
    finally:
        tmp.unlink()
    return path
