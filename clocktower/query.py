"""`clocktower query`: SQL against external ClickHouse, a running owner's endpoint, or the data dir itself.

Results come from the server already formatted (JSON, CSV, or text cells for the table), so no value goes
through Python types on the way: DateTime64(9) keeps its nanoseconds, maps stay objects, big integers stay
exact. A statement with its own FORMAT clause, and one that returns no rows (DDL, INSERT), gets the server's
output unchanged: nothing for DDL.
"""

from __future__ import annotations

import sys
from typing import BinaryIO

import clickhouse_connect
import orjson
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import ClickHouseError
from rich.console import Console

from clocktower.config import Settings
from clocktower.result_table import print_table
from clocktower.runtime.clickhouse_client import http_client
from clocktower.runtime.errors import UserError
from clocktower.runtime.owner_note import read_owner
from clocktower.sinks.endpoint.sql_scan import describe

# Our --format name -> (the server's output format, its settings).
SERVER_FORMATS: dict[str, tuple[str, dict[str, int]]] = {
    "json": ("JSONEachRow", {"output_format_json_array_of_rows": 1, "output_format_json_quote_64bit_integers": 0}),
    "csv": ("CSVWithNames", {}),
    "table": ("JSONCompactStringsEachRowWithNamesAndTypes", {}),
}


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


def run_query(settings: Settings, sql: str, fmt: str, console: Console, out: BinaryIO | None = None) -> None:
    statement = describe(sql.encode())
    if not statement.keyword or statement.keyword == ";":
        raise UserError("no SQL given")
    out = out or sys.stdout.buffer
    try:
        client = open_client(settings)  # an HTTP client logs in here: a wrong password fails here
        if statement.output_format or not statement.returns_rows:
            out.write(client.raw_query(sql))  # the server's own bytes
        else:
            server_format, server_settings = SERVER_FORMATS[fmt]
            body = client.raw_query(sql, fmt=server_format, settings=server_settings)
            if fmt == "table":
                lines = body.splitlines()
                names, types, *rows = (orjson.loads(line) for line in lines) if lines else ([], [])
                print_table(names, rows, types, console)
            else:
                out.write(body)
    except ClickHouseError as exc:
        line = str(exc).strip().splitlines()[0]
        raise UserError(line[line.find("Code: "):] if "Code: " in line else line) from None  # the server's words
    out.flush()
