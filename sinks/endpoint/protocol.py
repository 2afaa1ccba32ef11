"""ClickHouse HTTP query semantics on top of the engine, independent of the HTTP server.

The query text is the ``query`` parameter followed by a newline and the body.
For ``INSERT ... FORMAT fmt`` everything after the format name (and one
newline) is data: it is spooled to a file, preferably in RAM (/dev/shm), and
loaded with ``INSERT ... FROM INFILE``, the one bulk path chdb offers; ``VALUES``
data goes the same way as ``FORMAT Values``, so data is never read as SQL.
Spooling happens before a session is taken, so slow uploads block no query.
Every client statement is judged by the engine's parser and sql_guard first.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

from clocktower.sinks.endpoint.engine import ChdbEngine, QueryResult
from clocktower.sinks.endpoint.engine_config import SPOOL_PREFIX, SPOOL_SHOWN
from clocktower.sinks.endpoint.errors import QUERY_IS_TOO_LARGE, SYNTAX_ERROR, UNKNOWN_TYPE_OF_QUERY, ClickHouseError
from clocktower.sinks.endpoint.request_body import RequestBody
from clocktower.sinks.endpoint.request_params import RequestParams, add_form_fields
from clocktower.sinks.endpoint.sql_scan import NEED_MORE, InsertSplit, describe, split_insert

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


SPOOL_PLACEHOLDER = SPOOL_SHOWN


def header_safe(value: str | None) -> str | None:
    """``value`` if it may be echoed in a response header (printable ASCII), else None: no header injection."""
    return value if value is not None and value.isascii() and value.isprintable() else None


def content_type(fmt: str) -> str:
    """The Content-Type ClickHouse sends for output format ``fmt`` (its whole family, e.g. TSVWithNames)."""
    if fmt.startswith(_BINARY_FORMATS):
        return "application/octet-stream"
    if fmt in _CONTENT_TYPES:
        return _CONTENT_TYPES[fmt]
    if fmt.startswith(("TabSeparated", "TSV")):
        return _CONTENT_TYPES["TSV"]
    if fmt.startswith("CSVWithNames"):
        return _CONTENT_TYPES["CSVWithNames"]
    if fmt.startswith("JSON"):
        return _CONTENT_TYPES["JSON"]
    if fmt == "XML":
        return "application/xml; charset=UTF-8"
    if fmt == "Markdown":
        return "text/markdown; charset=UTF-8"
    return "text/plain; charset=UTF-8"


def _leb128(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def readonly_level(role_readonly: bool, method: str, requested: str | None) -> int:
    """The request's readonly level: the strictest of the role, the method and what the client asked for.

    1 (reads only, no settings) is stricter than 2 (reads and settings), which is stricter than 0.
    """
    asked = (requested or "").strip()
    client = 0 if asked in ("", "0") else 2 if asked == "2" else 1
    levels = {1 if role_readonly else 0, 2 if method == "GET" else 0, client}
    return 1 if 1 in levels else 2 if 2 in levels else 0


def _too_large(what: str, limit: int) -> ClickHouseError:
    return ClickHouseError(QUERY_IS_TOO_LARGE, f"{what} is larger than the endpoint's limit of {limit} bytes")


def _read_bounded(parts: list[bytes], chunks: Iterator[bytes], limit: int) -> bytes:
    """``parts`` and the rest of ``chunks`` joined, or QUERY_IS_TOO_LARGE once they pass ``limit``."""
    size = sum(len(p) for p in parts)
    if size > limit:
        raise _too_large("Query", limit)
    for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise _too_large("Query", limit)
        parts.append(chunk)
    return b"".join(parts)


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
        request runs on a readonly=1 session, whatever the client asks for. A GET runs at readonly=2 at least.
        Settings from the URL and from form fields may raise readonly, never lower it.
        """
        limits = self.engine.limits
        query_id = params.query_id or str(uuid.uuid4())
        chunks = iter(body)
        if body_type.lower().startswith("multipart/form-data"):
            add_form_fields(params, body_type, _read_bounded([], chunks, limits.max_query_bytes))
            chunks = iter(())
        level = readonly_level(readonly, method, params.settings.pop("readonly", None))
        if method == "GET" and not params.query:
            return Reply(body=b"Ok.\n", headers={"Content-Type": "text/html; charset=UTF-8"})
        prefix = (params.query + "\n").encode() if params.query else b""
        if len(prefix) > limits.max_query_bytes:
            raise _too_large("Query", limits.max_query_bytes)
        split, text = self._split(prefix, chunks)
        if split is not None:
            result = self._insert(split, text[split.data_start :], chunks, params, level)
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
        kind = "insert" if statement.keyword == "INSERT" else "read" if statement.returns_rows else "write"
        result = self._execute(text, fmt, params, level, kind, guard=text)
        out_fmt = statement.output_format or fmt
        data = result.data
        if not data and out_fmt == "Native" and statement.returns_rows:
            data = self._empty_native_block(statement.without_format(text), params, level)
        shown_fmt = out_fmt if statement.returns_rows or data else None
        return self._reply(result, params, query_id, shown_fmt, data)

    def _empty_native_block(self, sql: bytes, params: RequestParams, level: int) -> bytes:
        """The header-only block ClickHouse sends for an empty Native result; chdb sends nothing.

        Without it, clients lose the column names of empty results. DESCRIBE
        finds them without running the query again (``sql`` was judged already).
        """
        try:
            wrapped = b"DESCRIBE TABLE (\n" + sql + b"\n)"
            described = self._execute(wrapped, "JSONEachRow", params, level, "read", guard=wrapped)
        except ClickHouseError:
            return b""
        columns = [json.loads(line) for line in described.data.splitlines() if line]
        block = bytearray(_leb128(len(columns)) + _leb128(0))
        for column in columns:
            for text in (column["name"].encode(), column["type"].encode()):
                block += _leb128(len(text)) + text
        return bytes(block)

    def _execute(
        self, sql: bytes, fmt: str, params: RequestParams, level: int, kind: str, guard: bytes | None = None
    ) -> QueryResult:
        return self.engine.execute(
            sql, fmt, params.params, params.settings, params.database, readonly=level, kind=kind, guard=guard
        )

    def _split(self, prefix: bytes, chunks: Iterator[bytes]) -> tuple[InsertSplit | None, bytes]:
        """Find where INSERT data starts, if it is an insert, scanning the head at most twice.

        The URL's query alone often decides. Otherwise the body is read up to the head limit (or its
        end) and scanned once: rescanning after every chunk made large bodies quadratic.
        """
        limits = self.engine.limits
        found: InsertSplit | str | None = split_insert(prefix, complete=False) if prefix else NEED_MORE
        parts, size, complete = [prefix], len(prefix), False
        if found == NEED_MORE:
            while size < limits.insert_head_bytes:
                chunk = next(chunks, None)
                if chunk is None:
                    complete = True
                    break
                parts.append(chunk)
                size += len(chunk)
            buf = b"".join(parts)
            parts = [buf]
            head = buf[: limits.insert_head_bytes]
            found = split_insert(head, complete and len(head) == len(buf))
            if found == NEED_MORE:
                message = f"INSERT needs FORMAT <name> or VALUES within its first {limits.insert_head_bytes} bytes"
                raise ClickHouseError(QUERY_IS_TOO_LARGE, message)
        if isinstance(found, InsertSplit):
            return found, b"".join(parts)
        return None, _read_bounded(parts, chunks, limits.max_query_bytes)

    def _insert(
        self, split: InsertSplit, head_data: bytes, chunks: Iterator[bytes], params: RequestParams, level: int
    ) -> QueryResult:
        limit = self.engine.limits.max_insert_bytes
        # The suffix must not be .gz/.zst/...: ClickHouse picks INFILE decompression by extension.
        spool = tempfile.NamedTemporaryFile(  # noqa: SIM115 - closed before the engine reads it
            dir=self.spool_dir, prefix=SPOOL_PREFIX, suffix=".data", delete=False
        )
        try:
            with spool:
                size = len(head_data)
                spool.write(head_data)
                for chunk in chunks:
                    size += len(chunk)
                    if size > limit:
                        raise _too_large("INSERT data", limit)
                    spool.write(chunk)
                if size > limit:
                    raise _too_large("INSERT data", limit)
            sql = split.infile_sql(spool.name)
            try:
                return self._execute(sql, "TabSeparated", params, level, "insert", guard=split.head)
            except ClickHouseError as ex:  # the engine names the spool file: never show clients its path
                message = ex.message.replace(spool.name, SPOOL_PLACEHOLDER).replace(self.spool_dir, "<spool>")
                raise ClickHouseError(ex.code, message, ex.name) from None
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
        query_id = header_safe(query_id or (params.query_id if params else None))
        return {
            "X-ClickHouse-Query-Id": query_id or str(uuid.uuid4()),
            "X-ClickHouse-Timezone": header_safe(settings.get("session_timezone")) or self.engine.timezone,
            "X-ClickHouse-Server-Display-Name": self.display_name,
        }
