"""Column-type annotations shared by every event model.

Each alias carries its validation bounds (pydantic) and its ClickHouse type
(`CH`), so the codec, the DDL and the Arrow columns all derive from one place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from pydantic import Field


@dataclass(frozen=True)
class CH:
    """The ClickHouse type a field is stored as."""

    type: str


@dataclass(frozen=True)
class Codec:
    """How ClickHouse compresses a column, where ZSTD(1) alone is not the best (measured: benchmarks/storage.py).

    Timestamps in rows ordered by node then time change by small steps: Delta first. Sequence numbers step by a
    constant: DoubleDelta."""

    codec: str


DEFAULT_CODEC = "ZSTD(1)"   # beat LZ4, ClickHouse's default, on every column of the simulated fleet's tables
TIME_CODEC = "Delta, ZSTD(1)"          # timestamps
SEQUENCE_CODEC = "DoubleDelta, ZSTD(1)"  # sequence numbers, iterations


UInt8 = Annotated[int, Field(ge=0, le=2**8 - 1), CH("UInt8")]
UInt16 = Annotated[int, Field(ge=0, le=2**16 - 1), CH("UInt16")]
UInt32 = Annotated[int, Field(ge=0, le=2**32 - 1), CH("UInt32")]
UInt64 = Annotated[int, Field(ge=0, le=2**64 - 1), CH("UInt64")]
Int64 = Annotated[int, Field(ge=-(2**63), le=2**63 - 1), CH("Int64")]
# Finite only: JSON has no NaN or infinity, and neither has a meaning in telemetry.
Float64 = Annotated[float, Field(allow_inf_nan=False), CH("Float64")]
Bool = Annotated[bool, CH("Bool")]
Text = Annotated[str, Field(max_length=65536), CH("String")]
# Short repeated identifiers: node names, interfaces, jobs.
Name = Annotated[str, Field(min_length=1, max_length=256), CH("LowCardinality(String)")]
# Nanoseconds since the Unix epoch, on the clock of the node that took it.
# Bounded to 2000-01-01 .. 2100-01-01 so a garbage value is rejected at the door.
TimestampNs = Annotated[int, Field(ge=946_684_800 * 10**9, le=4_102_444_800 * 10**9), CH("Int64"),
                       Codec(TIME_CODEC)]
# A counter that steps by one per record of its series: a sequence number, an iteration.
Sequence = Annotated[int, Field(ge=0, le=2**64 - 1), CH("UInt64"), Codec(SEQUENCE_CODEC)]
DurationNs = Annotated[int, Field(ge=0, le=2**63 - 1), CH("Int64")]
