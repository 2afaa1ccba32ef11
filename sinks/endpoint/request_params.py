"""Sorting ClickHouse HTTP request parameters into query text, bindings and settings.

ClickHouse treats every URL parameter that is not reserved by the HTTP
interface as a setting for that one query; clients rely on this to send
per-query settings (clickhouse-connect sends several on every request).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from email.parser import BytesParser
from email.policy import HTTP

from clocktower.sinks.endpoint.errors import BAD_ARGUMENTS, NOT_IMPLEMENTED, ClickHouseError

# Parameters the HTTP interface consumes itself (ClickHouse's reserved names plus
# the transport knobs clients send); they are never applied as settings.
_TRANSPORT = """
    query database default_format query_id session_id session_timeout session_check close_session
    compress decompress enable_http_compression wait_end_of_query send_progress_in_http_headers
    http_headers_progress_interval_ms user password quota_key buffer_size client_protocol_version role
    stacktrace http_zlib_compression_level
"""
TRANSPORT_PARAMS = frozenset(_TRANSPORT.split())
MAX_QUERY_ID = 256
_TRUE = frozenset({"1", "true", "yes", "on"})


@dataclass
class RequestParams:
    """One request's parameters, after removing transport-only ones."""

    query: str = ""
    database: str | None = None
    default_format: str | None = None
    query_id: str | None = None
    params: dict[str, str] = field(default_factory=dict)
    settings: dict[str, str] = field(default_factory=dict)
    http_compression: bool | None = None  # enable_http_compression, when sent
    compression_level: int | None = None
    pinned: frozenset[str] = frozenset()  # set by X-ClickHouse-* headers, which win over parameters

    def add(self, name: str, value: str) -> None:
        if name in self.pinned:
            return
        if name.startswith("param_"):
            self.params[name[len("param_") :]] = value
        elif name == "query":
            self.query = value
        elif name == "database":
            self.database = value or None
        elif name == "default_format":
            self.default_format = value or None
        elif name == "enable_http_compression":
            self.http_compression = value.strip().lower() in _TRUE
        elif name == "http_zlib_compression_level":
            if value.strip() not in {str(level) for level in range(1, 10)}:
                raise ClickHouseError(BAD_ARGUMENTS, "http_zlib_compression_level must be between 1 and 9")
            self.compression_level = int(value)
        elif name == "query_id":
            if not (value.isascii() and value.isprintable()) or len(value) > MAX_QUERY_ID:
                # It is echoed in X-ClickHouse-Query-Id: a CR or LF would add response headers.
                message = f"query_id must be at most {MAX_QUERY_ID} printable ASCII characters"
                raise ClickHouseError(BAD_ARGUMENTS, message)
            self.query_id = value or None
        elif name in ("compress", "decompress") and value.strip().lower() in _TRUE:
            raise ClickHouseError(
                NOT_IMPLEMENTED,
                f"{name}=1 (ClickHouse native block compression) is not supported by the embedded endpoint;"
                " use HTTP Content-Encoding (gzip, deflate, zstd, lz4)",
            )
        elif name not in TRANSPORT_PARAMS:
            self.settings[name] = value


# Request headers ClickHouse reads in place of a parameter; the header wins when both are sent.
_HEADER_PARAMS = {"X-ClickHouse-Format": "default_format", "X-ClickHouse-Database": "database"}


def parse_params(pairs: Iterable[tuple[str, str]], headers: Mapping[str, str] | None = None) -> RequestParams:
    """The request's parameters; ``X-ClickHouse-Format`` and ``X-ClickHouse-Database`` override their parameters."""
    result = RequestParams()
    pinned = set()
    for header, name in _HEADER_PARAMS.items():
        value = (headers or {}).get(header)
        if value is not None:
            result.add(name, value.strip())
            pinned.add(name)
    result.pinned = frozenset(pinned)
    for name, value in pairs:
        result.add(name, value)
    return result


def add_form_fields(target: RequestParams, content_type: str, body: bytes) -> None:
    """Merge a multipart/form-data body (clickhouse-connect's long-parameter path) into ``target``."""
    message = BytesParser(policy=HTTP).parsebytes(f"Content-Type: {content_type}\r\n\r\n".encode() + body)
    if not message.is_multipart():
        raise ClickHouseError(NOT_IMPLEMENTED, "Malformed multipart/form-data request body")
    for part in message.iter_parts():
        if part.get_filename():
            message = "External data (file parts) is not supported by the embedded endpoint"
            raise ClickHouseError(NOT_IMPLEMENTED, message)
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True)
        if isinstance(name, str) and isinstance(payload, bytes):
            target.add(name, payload.decode())
