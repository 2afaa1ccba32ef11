"""Rows waiting for one insert, kept per (topic, partition) as in Quix Streams."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from hashlib import blake2b
from operator import attrgetter
from typing import Any

import pyarrow as pa

from clocktower.schemas.columns import model_columns
from clocktower.schemas.event import Event
from clocktower.schemas.topics import TOPICS, TopicSpec


@dataclass
class PartitionBatch:
    """Columns of decoded events from one partition, with the offsets they span.

    Only whole Kafka records are added, so an insert never splits a record. The
    dedup token also digests the records' bytes: after a broker lost records and
    reused their offsets, new records at old offsets are not taken for duplicates.
    `salt` (new per sink process and after every delete) keeps records read again
    after their rows were deleted from being dropped as duplicates of the first insert.
    """

    spec: TopicSpec
    partition: int
    salt: str = ""
    rows: int = 0
    first_offset: int = -1
    last_offset: int = -1
    created: float = field(default_factory=time.monotonic)
    _columns: dict[str, list] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._names = [c.name for c in model_columns(self.spec.model)]
        self._columns = {n: [] for n in self._names}
        self._columns["_partition"] = []
        self._columns["_offset"] = []
        self._columns["_node_mac"] = []
        # One C-level pass per record: a tuple of every field per event, then transposed.
        self._fields = attrgetter(*self._names)  # every model has at least node and ts_ns
        self._digest = blake2b(digest_size=8)

    def add(self, offset: int, events: list[Event], raw: bytes | None = None, node_mac: str = "unchecked") -> None:
        """Add one record's events, all or nothing: a failure leaves the columns as they were. `node_mac`: whether
        the record was signed by its node (schemas/clickhouse_ddl.py)."""
        columns = list(zip(*map(self._fields, events), strict=True))
        self.add_columns(offset, len(events), columns, raw if raw is not None else repr(events).encode(), node_mac)

    def add_columns(self, offset: int, rows: int, columns: Sequence[Sequence[Any]], raw: bytes,
                    node_mac: str = "unchecked") -> None:
        """Add one record's decoded columns (one per model field, in field order, each `rows` long), all or
        nothing; `raw` is the record's value, digested into the dedup token."""
        if len(columns) != len(self._names) or any(len(c) != rows for c in columns):
            raise ValueError(f"{len(columns)} columns for {len(self._names)} fields, or not {rows} rows each")
        for name, values in zip(self._names, columns, strict=True):
            self._columns[name].extend(values)
        self._digest.update(raw)
        self._columns["_partition"].extend([self.partition] * rows)
        self._columns["_offset"].extend([offset] * rows)
        self._columns["_node_mac"].extend([node_mac] * rows)
        if self.first_offset < 0:
            self.first_offset = offset
        self.last_offset = offset
        self.rows += rows

    @property
    def age(self) -> float:
        return time.monotonic() - self.created

    def dedup_token(self) -> str:
        """Same records -> same token, so a retried insert is dropped by ClickHouse."""
        return (f"{self.spec.name}:{self.partition}:{self.first_offset}-{self.last_offset}:{self.rows}:"
                f"{self._digest.hexdigest()}{':' + self.salt if self.salt else ''}")

    def to_arrow(self) -> pa.Table:
        arrays, names = [], []
        for col in model_columns(self.spec.model):
            arrays.append(pa.array(self._columns[col.name], type=col.arrow_type))
            names.append(col.name)
        arrays.append(pa.array(self._columns["_partition"], type=pa.uint32()))
        arrays.append(pa.array(self._columns["_offset"], type=pa.int64()))
        arrays.append(pa.DictionaryArray.from_arrays(pa.array([0] * self.rows, type=pa.int32()),
                                                     pa.array([self.spec.name])))
        arrays.append(pa.array(self._columns["_node_mac"], type=pa.string()).dictionary_encode())
        names += ["_partition", "_offset", "_topic", "_node_mac"]
        return pa.Table.from_arrays(arrays, names=names)


def warm_up() -> None:
    """Convert an empty batch of every topic once, at start: pyarrow imports pandas on its first conversion (0.2 s,
    a fifth of the sink's CPU in pipeline_throughput's short run, inside the first insert)."""
    for spec in TOPICS:
        PartitionBatch(spec, 0).to_arrow()
