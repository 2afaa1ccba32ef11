"""Generating the data dir's secrets on first start: ClickHouse users and the control key.

There are no built-in passwords or keys. The first start writes random ones (0600, never overwritten);
every later process (the endpoint, the sink, the streams, `clocktower query`) reads them through
clocktower.runtime.credentials unless CLOCKTOWER_* settings name others.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path

from clocktower.runtime.credentials import ADMIN_USER, DASHBOARDS_USER, control_key_path, credentials_path
from clocktower.runtime.private_file import create_private_file, private_dir


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
