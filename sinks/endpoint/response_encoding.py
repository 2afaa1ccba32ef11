"""HTTP response compression, as ClickHouse does it when ``enable_http_compression`` is on.

The setting's default is the engine's: chdb's is 1 and its system.settings says so, so clickhouse-connect
sends only ``Accept-Encoding`` (it adds ``enable_http_compression=1`` only where the default is 0); a
request's ``enable_http_compression=0`` turns it off. The client lists what it accepts in
``Accept-Encoding``; the server picks in ClickHouse's own order of preference (zstd, br, lz4, gzip,
deflate, xz, bz2), skipping what this Python cannot write, at ``http_zlib_compression_level`` (1-9,
ClickHouse's default 3; xz and bz2 at 1 at most). Pure functions: the HTTP server decides when to call them.
"""

from __future__ import annotations

import bz2
import lzma
import zlib
from collections.abc import Callable

from clocktower.sinks.endpoint.request_body import _lz4_frame, _zstd

DEFAULT_LEVEL = 3
# xz and bz2 are slow and xz's high presets take hundreds of MiB: any reader may ask for them, so level 1 at most.
SLOW_MAX_LEVEL = 1


def _gzip(data: bytes, level: int) -> bytes:
    packer = zlib.compressobj(level, zlib.DEFLATED, 31)
    return packer.compress(data) + packer.flush()


def _encoders() -> dict[str, Callable[[bytes, int], bytes]]:
    found: dict[str, Callable[[bytes, int], bytes]] = {}
    if _zstd is not None:
        found["zstd"] = lambda data, level: _zstd.compress(data, level)
    if _lz4_frame is not None:
        found["lz4"] = lambda data, level: _lz4_frame.compress(data)
    found["gzip"] = _gzip
    found["deflate"] = lambda data, level: zlib.compress(data, level)
    found["xz"] = lambda data, level: lzma.compress(data, preset=min(max(level, 0), SLOW_MAX_LEVEL))
    found["bz2"] = lambda data, level: bz2.compress(data, SLOW_MAX_LEVEL)
    return found


ENCODERS = _encoders()
PREFERENCE = ("zstd", "br", "lz4", "snappy", "gzip", "deflate", "xz", "bz2")  # ClickHouse's chooseHTTPCompressionMethod


def choose(accept_encoding: str | None) -> str | None:
    """The Content-Encoding to send for this Accept-Encoding, or None (identity)."""
    offered: set[str] = set()
    for item in (accept_encoding or "").lower().split(","):
        name, _, params = item.partition(";")
        quality = params.strip().removeprefix("q=").strip()
        if quality not in ("0", "0.0", "0.00", "0.000"):
            offered.add("gzip" if name.strip() == "x-gzip" else name.strip())
    return next((name for name in PREFERENCE if name in offered and name in ENCODERS), None)


def compress(data: bytes, encoding: str, level: int | None = None) -> bytes:
    """``data`` in ``encoding`` (a name ``choose`` returned)."""
    return ENCODERS[encoding](data, DEFAULT_LEVEL if level is None else level)
