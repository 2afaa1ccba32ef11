"""ClickHouse-shaped errors, so HTTP clients see what a real server would send.

clickhouse-connect and Grafana read the numeric code from the
``X-ClickHouse-Exception-Code`` header and the symbolic name from the body, and
pick retry behaviour from the HTTP status, so all three must look genuine.
"""

from __future__ import annotations

import re

_PREFIX_RE = re.compile(r"^(?:\s*(?:\w+Error: )?Code: (\d+)\. DB::Exception: )+")
_SUFFIX_RE = re.compile(r"(?:\.?\s*\(([A-Z][A-Z0-9_]*)\)(?:\s*\(version [^)]*\))?\.?\s*)$")

# Error names mapped to the HTTP status ClickHouse's HTTPHandler uses; the rest are 500.
_BAD_REQUEST = """
    SYNTAX_ERROR INCORRECT_DATA TYPE_MISMATCH DUPLICATE_COLUMN ILLEGAL_COLUMN UNKNOWN_ELEMENT_IN_AST BAD_ARGUMENTS
    UNKNOWN_TYPE_OF_AST_NODE TOO_DEEP_AST TOO_BIG_AST UNEXPECTED_AST_STRUCTURE
    VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE CANNOT_DECOMPRESS CANNOT_READ_ALL_DATA
"""
_NOT_FOUND = """
    UNKNOWN_TABLE UNKNOWN_FUNCTION UNKNOWN_IDENTIFIER UNKNOWN_TYPE UNKNOWN_STORAGE UNKNOWN_DATABASE
    UNKNOWN_SETTING UNKNOWN_DIRECTION_OF_SORTING UNKNOWN_AGGREGATE_FUNCTION UNKNOWN_FORMAT
    UNKNOWN_DATABASE_ENGINE UNKNOWN_TYPE_OF_QUERY
"""
_STATUS_BY_NAME: dict[str, int] = {
    **dict.fromkeys(_BAD_REQUEST.split(), 400),
    **dict.fromkeys(_NOT_FOUND.split(), 404),
    "READONLY": 403,
    "ACCESS_DENIED": 403,
    "SETTING_CONSTRAINT_VIOLATION": 400,
    "QUERY_IS_TOO_LARGE": 413,
    "TOO_MANY_SIMULTANEOUS_QUERIES": 503,
    "NOT_IMPLEMENTED": 501,
}

SYNTAX_ERROR = 62
NOT_IMPLEMENTED = 48
READONLY = 164
UNKNOWN_COMPRESSION_METHOD = 89
CANNOT_DECOMPRESS = 271
CANNOT_READ_ALL_DATA = 33
UNKNOWN_TYPE_OF_QUERY = 78
STD_EXCEPTION = 1001
ACCESS_DENIED = 497
AUTHENTICATION_FAILED = 516
BAD_ARGUMENTS = 36
SETTING_CONSTRAINT_VIOLATION = 452
TIMEOUT_EXCEEDED = 159
QUERY_IS_TOO_LARGE = 229
TOO_MANY_SIMULTANEOUS_QUERIES = 202

_NAMES = {
    SYNTAX_ERROR: "SYNTAX_ERROR",
    NOT_IMPLEMENTED: "NOT_IMPLEMENTED",
    READONLY: "READONLY",
    UNKNOWN_COMPRESSION_METHOD: "UNKNOWN_COMPRESSION_METHOD",
    CANNOT_DECOMPRESS: "CANNOT_DECOMPRESS",
    CANNOT_READ_ALL_DATA: "CANNOT_READ_ALL_DATA",
    UNKNOWN_TYPE_OF_QUERY: "UNKNOWN_TYPE_OF_QUERY",
    STD_EXCEPTION: "STD_EXCEPTION",
    ACCESS_DENIED: "ACCESS_DENIED",
    AUTHENTICATION_FAILED: "AUTHENTICATION_FAILED",
    BAD_ARGUMENTS: "BAD_ARGUMENTS",
    SETTING_CONSTRAINT_VIOLATION: "SETTING_CONSTRAINT_VIOLATION",
    TIMEOUT_EXCEEDED: "TIMEOUT_EXCEEDED",
    QUERY_IS_TOO_LARGE: "QUERY_IS_TOO_LARGE",
    TOO_MANY_SIMULTANEOUS_QUERIES: "TOO_MANY_SIMULTANEOUS_QUERIES",
}


class ClickHouseError(Exception):
    """An error with a ClickHouse code and name, raised by the engine or the endpoint."""

    def __init__(self, code: int, message: str, name: str | None = None) -> None:
        self.code = code
        self.name = name or _NAMES.get(code, "UNKNOWN_EXCEPTION")
        self.message = message.rstrip(". ")
        super().__init__(f"Code: {self.code}. DB::Exception: {self.message}. ({self.name})")

    @classmethod
    def from_engine(cls, text: str) -> ClickHouseError:
        """Parse chdb's error text, which may repeat the ``Code:`` prefix and name suffix."""
        text = text.strip()
        prefix = _PREFIX_RE.match(text)
        if prefix is None:
            return cls(STD_EXCEPTION, text or "unknown engine error")
        body = text[prefix.end() :]
        name = None
        while (suffix := _SUFFIX_RE.search(body)) is not None and suffix.start() > 0:
            name = name or suffix.group(1)
            body = body[: suffix.start()]
        # Nested errors repeat "Code: N. DB::Exception:" inside the message too.
        body = _PREFIX_RE.sub("", body)
        return cls(int(prefix.group(1)), body, name)

    @property
    def http_status(self) -> int:
        return _STATUS_BY_NAME.get(self.name, 500)

    def body(self, version: str) -> bytes:
        """The response body exactly as ClickHouse formats it."""
        text = f"Code: {self.code}. DB::Exception: {self.message}. ({self.name}) (version {version})\n"
        return text.encode()
