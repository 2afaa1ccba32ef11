"""How much memory each table partition's RocksDB may hold, instead of Faust's defaults.

Every partition of every table is its own RocksDB. Faust opens each with up to 3 write buffers of 64 MiB and a
2 GiB block cache, so a worker's memory grows with what is written to its state, not with what is kept: 600
invented node names (453k events) took one from 122 to 422 MB (issue 18, finding 12). The entries themselves are a
few hundred bytes each (streams/state_store.py caps their number), so small buffers and a small cache lose nothing
that matters: a detector reads each entry once per batch, and RocksDB's files stay on disk.
"""

from __future__ import annotations

from typing import Any

WRITE_BUFFER_BYTES = 4 * 1024 * 1024
WRITE_BUFFERS = 2
BLOCK_CACHE_BYTES = 8 * 1024 * 1024


def table_options() -> dict[str, Any]:
    """A new dict for each table: Faust's RocksDB store pops keys from the one it is given."""
    return {"write_buffer_size": WRITE_BUFFER_BYTES, "max_write_buffer_number": WRITE_BUFFERS,
            "block_cache_size": BLOCK_CACHE_BYTES}
