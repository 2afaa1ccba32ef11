"""`clocktower query`: SQL against external ClickHouse, a running owner's endpoint, or the data dir itself."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from typing import Any

import clickhouse_connect
import orjson
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import ClickHouseError
from rich.console import Console
from rich.table import Table

from clocktower.clickhouse_client import http_client
from clocktower.config import Settings
from clocktower.data_dir import read_owner
from clocktower.errors import UserError


def open_client(settings: Settings) -> Client:
    """External ClickHouse if configured; else the endpoint of whoever owns the data dir; else the dir itself."""
    if not settings.embedded_clickhouse:
        return http_client(settings.clickhouse, *settings.clickhouse_login(), settings.clickhouse_database)
    owner = read_owner(settings.data_dir)
    if owner:
        return http_client(owner["clickhouse"], *settings.clickhouse_login())
    path = settings.data_dir / "clickhouse"
    if not path.exists():
        raise UserError(f"no ClickHouse data under {settings.data_dir}: run `clocktower demo` or `clocktower up` "
                        "first, or pass --data-dir")
    try:
        return clickhouse_connect.get_client(interface="chdb", path=str(path))
    except Exception as exc:
        if "lock" in str(exc).lower():
            raise UserError(f"{path} is locked by another process that is not a clocktower owner: "
                            "stop it and retry") from None
        raise


def run_query(settings: Settings, sql: str, fmt: str, console: Console) -> None:
    try:
        client = open_client(settings)  # an HTTP client logs in here: a wrong password fails here
        result = client.query(sql)
    except ClickHouseError as exc:
        line = str(exc).strip().splitlines()[0]
        raise UserError(line[line.find("Code: "):] if "Code: " in line else line) from None  # the server's words
    print_result(result.column_names, result.result_rows, fmt, console)


def _plain(v: Any) -> Any:
    return v if isinstance(v, (int, float, str, bool)) or v is None else str(v)


def print_result(names: Sequence[str], rows: Sequence[Sequence[Any]], fmt: str, console: Console) -> None:
    if fmt == "json":
        print(orjson.dumps([dict(zip(names, map(_plain, r), strict=True)) for r in rows]).decode())
    elif fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(names)
        w.writerows([[_plain(v) for v in r] for r in rows])
        print(buf.getvalue(), end="")
    else:
        table = Table(*names)
        for r in rows:
            table.add_row(*(str(_plain(v)) for v in r))
        console.print(table)
