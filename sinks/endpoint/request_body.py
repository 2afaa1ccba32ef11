"""Streaming reader for HTTP request bodies: framing first, then Content-Encoding.

Insert bodies can be hundreds of megabytes, so they are decoded chunk by chunk
straight into the spool file instead of being held in memory. clickhouse-connect
streams ``insert()`` with chunked transfer encoding and compresses each block as
its own gzip member, lz4 frame or zstd frame, so decoders restart at frame ends.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator, Mapping
from typing import IO, Any, Protocol

from clocktower.sinks.endpoint.errors import (
    CANNOT_DECOMPRESS,
    CANNOT_READ_ALL_DATA,
    UNKNOWN_COMPRESSION_METHOD,
    ClickHouseError,
)

try:
    from compression import zstd as _zstd  # type: ignore[import-not-found]  # Python 3.14+
except ImportError:
    try:
        from backports import zstd as _zstd  # type: ignore[no-redef]
    except ImportError:
        _zstd = None

try:
    import lz4.frame as _lz4_frame
except ImportError:
    _lz4_frame = None

_READ_SIZE = 1 << 20


class _Decompressor(Protocol):
    eof: bool
    unused_data: bytes

    def decompress(self, data: bytes) -> bytes: ...


class _FrameDecoder:
    """Decodes a concatenation of compressed frames (or gzip members) incrementally."""

    def __init__(
        self, name: str, factory: Callable[[], _Decompressor], fallback: Callable[[], Any] | None = None
    ) -> None:
        self._name = name
        self._factory = factory
        self._fallback = fallback
        self._decoder = factory()
        self._in_frame = False
        self._started = False

    def feed(self, data: bytes) -> bytes:
        out: list[bytes] = []
        while data:
            try:
                out.append(self._decoder.decompress(data))
            except Exception as ex:
                if self._started or self._fallback is None:
                    message = f"Cannot decode {self._name} request body: {ex}"
                    raise ClickHouseError(CANNOT_DECOMPRESS, message) from None
                # HTTP "deflate" is zlib-wrapped by the RFC but raw deflate in practice; try both.
                self._factory, self._fallback = self._fallback, None
                self._decoder = self._factory()
                continue
            self._started = True
            if self._decoder.eof:
                data = self._decoder.unused_data
                self._decoder = self._factory()
                self._in_frame = False
            else:
                data = b""
                self._in_frame = True
        return b"".join(out)

    def finish(self) -> bytes:
        if self._in_frame:
            raise ClickHouseError(CANNOT_DECOMPRESS, f"Truncated {self._name} request body")
        return b""


class _Identity:
    def feed(self, data: bytes) -> bytes:
        return data

    def finish(self) -> bytes:
        return b""


def _decoder_for(encoding: str) -> _FrameDecoder | _Identity:
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return _Identity()
    if encoding in ("gzip", "x-gzip"):
        return _FrameDecoder("gzip", lambda: zlib.decompressobj(wbits=31))
    if encoding == "deflate":
        return _FrameDecoder("deflate", zlib.decompressobj, lambda: zlib.decompressobj(wbits=-15))
    if encoding == "zstd" and _zstd is not None:
        return _FrameDecoder("zstd", _zstd.ZstdDecompressor)
    if encoding == "lz4" and _lz4_frame is not None:
        return _FrameDecoder("lz4", _lz4_frame.LZ4FrameDecompressor)
    raise ClickHouseError(UNKNOWN_COMPRESSION_METHOD, f"Unsupported Content-Encoding: {encoding}")


class RequestBody:
    """Iterates a request's decoded body once; tracks whether the wire is fully read."""

    def __init__(self, rfile: IO[bytes], headers: Mapping[str, str]) -> None:
        self._rfile = rfile
        chunked = headers.get("Transfer-Encoding", "").strip().lower() == "chunked"   # (request_framing.py)
        length = headers.get("Content-Length")
        if not chunked and length is not None and not length.strip().isdigit():
            raise ClickHouseError(CANNOT_READ_ALL_DATA, f"Invalid Content-Length: {length}")
        self._remaining = None if chunked else int(length or 0)
        self.exhausted = self._remaining == 0
        self._raw = self._chunked() if chunked else self._sized()
        self._encoding = headers.get("Content-Encoding", "")

    def __iter__(self) -> Iterator[bytes]:
        decoder = _decoder_for(self._encoding)
        for chunk in self._raw:
            out = decoder.feed(chunk)
            if out:
                yield out
        tail = decoder.finish()
        if tail:
            yield tail

    def read_all(self) -> bytes:
        return b"".join(self)

    def drain(self, limit: int = 256 << 20) -> bool:
        """Discard unread input so the connection can serve its next request."""
        total = 0
        try:
            for chunk in self._raw:
                total += len(chunk)
                if total > limit:
                    return False
        except (ClickHouseError, OSError):
            return False
        return self.exhausted

    def _sized(self) -> Iterator[bytes]:
        assert self._remaining is not None
        while self._remaining > 0:
            chunk = self._rfile.read(min(self._remaining, _READ_SIZE))
            if not chunk:
                raise ClickHouseError(CANNOT_READ_ALL_DATA, "Request body ended before Content-Length")
            self._remaining -= len(chunk)
            yield chunk
        self.exhausted = True

    def _chunked(self) -> Iterator[bytes]:
        while True:
            line = self._rfile.readline(1024)
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise ClickHouseError(CANNOT_READ_ALL_DATA, "Malformed chunked request body") from None
            if size == 0:
                while self._rfile.readline(8192) not in (b"\r\n", b"\n", b""):
                    pass  # trailer fields
                self.exhausted = True
                return
            while size > 0:
                chunk = self._rfile.read(min(size, _READ_SIZE))
                if not chunk:
                    raise ClickHouseError(CANNOT_READ_ALL_DATA, "Request body ended inside a chunk")
                size -= len(chunk)
                yield chunk
            self._rfile.readline(8)  # CRLF after the chunk data
