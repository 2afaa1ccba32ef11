"""ClickHouse HTTP query semantics on top of the engine, independent of the HTTP server.

The query text is the ``query`` parameter followed by a newline and the body.
For ``INSERT ... FORMAT fmt`` everything after the format name (and one
newline) is data: it is spooled to a file, preferably in RAM (/dev/shm), and
loaded with ``INSERT ... FROM INFILE``, the one bulk path chdb offers. Spooling
happens outside the engine lock, so slow uploads do not block other queries.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

from sinks.endpoint.engine import ChdbEngine, QueryResult
from sinks.endpoint.errors import SYNTAX_ERROR, UNKNOWN_TYPE_OF_QUERY, ClickHouseError
from sinks.endpoint.request_body import RequestBody
from sinks.endpoint.request_params import RequestParams, add_form_fields
from sinks.endpoint.sql_scan import InsertSplit, describe, split_insert

_BINARY = "Native RowBinary Arrow ArrowStream Parquet ORC Avro Protobuf CapnProto MsgPack BSONEachRow Npy"
_BINARY_FORMATS = tuple(_BINARY.split())
_CONTENT_TYPES = {
    "TabSeparated": "text/tab-separated-values; charset=UTF-8",
    "TSV": "text/tab-separated-values; charset=UTF-8",
    "CSV": "text/csv; charset=UTF-8; header=absent",
    "CSVWithNames": "text/csv; charset=UTF-8; header=present",
    "JSON": "application/json; charset=UTF-8",
    "JSONCompact": "application/json; charset=UTF-8",
    "JSONEachRow": "application/x-ndjson; charset=UTF-8",
}


def content_type(fmt: str) -> str:
    if fmt.startswith(_BINARY_FORMATS):
        return "application/octet-stream"
    return _CONTENT_TYPES.get(fmt, "text/plain; charset=UTF-8")


def _leb128(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def default_spool_dir() -> str:
    """RAM-backed /dev/shm when writable, so spooled inserts never touch disk."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else tempfile.gettempdir()


@dataclass
class Reply:
    """What to send back: status, body and the ClickHouse response headers."""

    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)


class ClickHouseProtocol:
    """Runs one ClickHouse HTTP request against the engine."""

    def __init__(
        self, engine: ChdbEngine, spool_dir: str | None = None, display_name: str = "clocktower"
    ) -> None:
        self.engine = engine
        self.spool_dir = spool_dir or default_spool_dir()
        self.display_name = display_name

    def handle(
        self, method: str, params: RequestParams, body: RequestBody, body_type: str, readonly: bool = False
    ) -> Reply:
        """Execute the request; raises ClickHouseError for anything ClickHouse would reject.

        ``readonly`` is the caller's role (the HTTP layer decides it from the authenticated user): when true the
        request runs with readonly=1, whatever the client asks for.
        """
        if readonly:
            params.settings["readonly"] = "1"
        query_id = params.query_id or str(uuid.uuid4())
        if body_type.lower().startswith("multipart/form-data"):
            add_form_fields(params, body_type, body.read_all())
        if method == "GET" and params.settings.get("readonly", "0") in ("", "0"):
            params.settings["readonly"] = "2"  # as in ClickHouse: GET never modifies data
        if method == "GET" and not params.query:
            return Reply(body=b"Ok.\n", headers={"Content-Type": "text/html; charset=UTF-8"})
        prefix = (params.query + "\n").encode() if params.query else b""
        chunks = iter(body)
        split, text = self._split(prefix, chunks)
        if split is not None:
            result = self._insert(split, text[split.data_start :], chunks, params)
            return self._reply(result, params, query_id, None, b"")
        if not text.strip():
            raise ClickHouseError(SYNTAX_ERROR, "Empty query")
        statement = describe(text)
        if statement.multi_statement:
            raise ClickHouseError(SYNTAX_ERROR, "Multi-statements are not allowed")
        if statement.from_infile:
            # As in ClickHouse: INFILE names a client-side file, so a server refuses it.
            raise ClickHouseError(UNKNOWN_TYPE_OF_QUERY, "Query has infile and was send directly to server")
        fmt = params.default_format or "TabSeparated"
        result = self._execute(text, fmt, params)
        out_fmt = statement.output_format or fmt
        data = result.data
        if not data and out_fmt == "Native" and statement.returns_rows:
            data = self._empty_native_block(statement.without_format(text), params)
        shown_fmt = out_fmt if statement.returns_rows or data else None
        return self._reply(result, params, query_id, shown_fmt, data)

    def _empty_native_block(self, sql: bytes, params: RequestParams) -> bytes:
        """The header-only block ClickHouse sends for an empty Native result; chdb sends nothing.

        Without it, clients lose the column names of empty results. DESCRIBE
        finds them without running the query again.
        """
        try:
            wrapped = b"DESCRIBE TABLE (\n" + sql + b"\n)"
            described = self._execute(wrapped, "JSONEachRow", params)
        except ClickHouseError:
            return b""
        columns = [json.loads(line) for line in described.data.splitlines() if line]
        block = bytearray(_leb128(len(columns)) + _leb128(0))
        for column in columns:
            for text in (column["name"].encode(), column["type"].encode()):
                block += _leb128(len(text)) + text
        return bytes(block)

    def _execute(self, sql: bytes, fmt: str, params: RequestParams) -> QueryResult:
        return self.engine.execute(sql, fmt, params.params, params.settings, params.database)

    @staticmethod
    def _split(prefix: bytes, chunks: Iterator[bytes]) -> tuple[InsertSplit | None, bytes]:
        """Read just enough of the body to find where INSERT data starts, if it is an insert."""
        buf = prefix
        complete = False
        while True:
            found = split_insert(buf, complete)
            if isinstance(found, InsertSplit):
                return found, buf
            if found is None:
                return None, buf + b"".join(chunks)
            chunk = next(chunks, None)
            if chunk is None:
                complete = True
            else:
                buf += chunk

    def _insert(
        self, split: InsertSplit, head_data: bytes, chunks: Iterator[bytes], params: RequestParams
    ) -> QueryResult:
        # The suffix must not be .gz/.zst/...: ClickHouse picks INFILE decompression by extension.
        spool = tempfile.NamedTemporaryFile(  # noqa: SIM115 - closed before the engine reads it
            dir=self.spool_dir, prefix="clocktower-insert-", suffix=".data", delete=False
        )
        try:
            with spool:
                spool.write(head_data)
                for chunk in chunks:
                    spool.write(chunk)
            sql = split.infile_sql(spool.name)
            return self._execute(sql, "TabSeparated", params)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(spool.name)

    def _reply(
        self, result: QueryResult, params: RequestParams, query_id: str, fmt: str | None, data: bytes
    ) -> Reply:
        summary = {
            "read_rows": str(result.rows_read),
            "read_bytes": str(result.bytes_read),
            "written_rows": str(result.rows_written),
            "written_bytes": str(result.bytes_written),
            "total_rows_to_read": str(result.rows_read),
            "result_bytes": str(len(data)),
            "elapsed_ns": str(result.elapsed_ns),
        }
        headers = self.common_headers(params, query_id)
        headers["X-ClickHouse-Summary"] = json.dumps(summary, separators=(",", ":"))
        headers["Content-Type"] = content_type(fmt) if fmt else "text/plain; charset=UTF-8"
        if fmt:
            headers["X-ClickHouse-Format"] = fmt
        return Reply(200, data, headers)

    def common_headers(self, params: RequestParams | None, query_id: str | None = None) -> dict[str, str]:
        """Headers ClickHouse sends on every response, errors included."""
        settings = params.settings if params else {}
        return {
            "X-ClickHouse-Query-Id": query_id or (params.query_id if params else None) or str(uuid.uuid4()),
            "X-ClickHouse-Timezone": settings.get("session_timezone") or self.engine.timezone,
            "X-ClickHouse-Server-Display-Name": self.display_name,
        }
