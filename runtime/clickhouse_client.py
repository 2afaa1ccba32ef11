"""One way to reach ClickHouse over HTTP, for the sink, the CLI and the tests alike."""

from __future__ import annotations

from urllib.parse import urlparse

import clickhouse_connect
from clickhouse_connect.driver.client import Client


def http_client(url: str, user: str = "default", password: str = "", database: str = "default",
                **kwargs: object) -> Client:
    u = urlparse(url)
    secure = u.scheme == "https"
    return clickhouse_connect.get_client(
        host=u.hostname, port=u.port or (8443 if secure else 8123), interface=u.scheme,
        username=u.username or user, password=u.password or password, database=database,
        compress="lz4", **kwargs,
    )
