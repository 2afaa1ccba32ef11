"""Reading the secrets `clocktower up` generates in the data dir: ClickHouse logins and the control key pair.

The write side (clocktower/generated_secrets.py) is the CLI's; every service reads them through here, so the
file names and formats are defined once. Files are read with runtime/private_file.py's checks (0600, own user).

credentials.json holds two users of the embedded ClickHouse endpoint:
``clocktower`` (read-write: the sink, the CLI, the demo) and ``dashboards`` (readonly=1, for Grafana).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from clocktower.runtime.errors import UserError
from clocktower.runtime.private_file import read_private_file
from clocktower.schemas.record_mac import NodeSigning

CREDENTIALS_FILE = "credentials.json"
CONTROL_KEY_FILE = "control.key"          # Ed25519 private key (PEM, 0600): signs control commands
CONTROL_PUBLIC_KEY_FILE = "control.pub"   # its public key (PEM): all an actuator gets
PRODUCER_KEY_FILE = "producer.key"        # the cluster's producer key (hex, 0600): node keys derive from it
ADMIN_USER = "clocktower"
DASHBOARDS_USER = "dashboards"


def credentials_path(data_dir: Path) -> Path:
    return data_dir / CREDENTIALS_FILE


def control_key_path(data_dir: Path) -> Path:
    return data_dir / CONTROL_KEY_FILE


def producer_key_path(data_dir: Path) -> Path:
    return data_dir / PRODUCER_KEY_FILE


def producer_key_of(data_dir: Path | None) -> bytes | None:
    """CLOCKTOWER_PRODUCER_KEY (or _FILE), else the producer key `up` or `demo` made in `data_dir`, else None.

    A pydantic ValidationError when the configured key, or the data dir's file, is unfit (short, or readable by
    others): the CLI prints it as one line."""
    configured = NodeSigning().producer_key_bytes()
    if configured is not None or data_dir is None or not os.path.lexists(producer_key_path(data_dir)):
        return configured
    return NodeSigning(producer_key_file=producer_key_path(data_dir)).producer_key_bytes()


def control_public_key_path(data_dir: Path) -> Path:
    return data_dir / CONTROL_PUBLIC_KEY_FILE


def read_users(path: Path) -> dict[str, tuple[str, bool]]:
    """user -> (password, readonly) from a credentials file; UserError when it is missing or malformed."""
    try:
        doc = json.loads(read_private_file(path))
        users = {str(name): (u["password"], bool(u["readonly"])) for name, u in doc["users"].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UserError(f"{path} is not a clocktower credentials file ({type(exc).__name__}: {exc})") from None
    if not users or not all(isinstance(p, str) and p for p, _ in users.values()):
        raise UserError(f"{path} names no user, or a user without a password")
    return users


def admin_login(data_dir: Path) -> tuple[str, str] | None:
    """The read-write user and its password from the data dir, or None before the first start."""
    path = credentials_path(data_dir)
    if not path.exists():
        return None
    login = read_users(path).get(ADMIN_USER)
    if login is None:
        raise UserError(f"{path} has no {ADMIN_USER!r} user: set CLOCKTOWER_CLICKHOUSE_USER and _PASSWORD")
    return ADMIN_USER, login[0]


def read_control_key(data_dir: Path) -> bytes | None:
    """The generated private signing key (PEM bytes), or None before the first start."""
    path = control_key_path(data_dir)
    if not path.exists():
        return None
    return read_private_file(path)
