"""The secrets `clocktower up` generates in the data dir on first start: ClickHouse users and the control key.

There are no built-in passwords or keys. The first start writes random ones (0600, never overwritten);
every later process (the endpoint, the sink, the streams, `clocktower query`) reads them from there
unless CLOCKTOWER_* settings name others.

credentials.json holds two users of the embedded ClickHouse endpoint:
``clocktower`` (read-write: the sink, the CLI, the demo) and ``dashboards`` (readonly=1, for Grafana).
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path

from clocktower.errors import UserError
from clocktower.private_file import create_private_file, private_dir, read_private_file

CREDENTIALS_FILE = "credentials.json"
CONTROL_KEY_FILE = "control.key"
ADMIN_USER = "clocktower"
DASHBOARDS_USER = "dashboards"


def credentials_path(data_dir: Path) -> Path:
    return data_dir / CREDENTIALS_FILE


def control_key_path(data_dir: Path) -> Path:
    return data_dir / CONTROL_KEY_FILE


def ensure_secrets(data_dir: Path, clickhouse_users: bool = True) -> None:
    """Generate the control key and (for the embedded endpoint) its users unless they exist; never overwrites."""
    private_dir(data_dir)
    create_private_file(control_key_path(data_dir), secrets.token_urlsafe(32).encode() + b"\n")
    if not clickhouse_users:
        return
    users = {
        ADMIN_USER: {"password": secrets.token_urlsafe(24), "readonly": False},
        DASHBOARDS_USER: {"password": secrets.token_urlsafe(24), "readonly": True},
    }
    create_private_file(credentials_path(data_dir), json.dumps({"users": users}, indent=2).encode() + b"\n")


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
    """The generated command-signing key, or None before the first start."""
    path = control_key_path(data_dir)
    if not path.exists():
        return None
    key = read_private_file(path).strip()
    if len(key) < 32:
        raise UserError(f"{path} holds no usable key: delete it and restart `clocktower up`")
    return key
