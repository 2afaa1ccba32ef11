"""The base every event model derives from."""

from __future__ import annotations

from typing import ClassVar

from clocktower.schemas.column_types import Name, TimestampNs
from pydantic import BaseModel, ConfigDict


class Event(BaseModel):
    """One timestamped fact reported by (or about) one node.

    `SCHEMA` and `VERSION` travel in the Kafka headers; `ORDER_BY` is the
    ClickHouse sorting key. Events derived by at-least-once processors set
    `REPLACING = True`: `ORDER_BY` is then their natural key, the table is a
    ReplacingMergeTree, and a re-emitted duplicate collapses (read with FINAL).
    Unknown fields are rejected so that a producer bug shows up in `deadletter`
    instead of silently dropping data.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    SCHEMA: ClassVar[str]
    VERSION: ClassVar[int] = 1
    ORDER_BY: ClassVar[tuple[str, ...]] = ("node", "ts_ns")
    REPLACING: ClassVar[bool] = False

    node: Name
    ts_ns: TimestampNs
