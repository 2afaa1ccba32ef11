"""Derive table columns (ClickHouse and Arrow types) from an event model."""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal

import pyarrow as pa

from clocktower.schemas.column_types import CH, DEFAULT_CODEC, Codec
from clocktower.schemas.event import Event

_ARROW = {
    "UInt8": pa.uint8(), "UInt16": pa.uint16(), "UInt32": pa.uint32(), "UInt64": pa.uint64(),
    "Int64": pa.int64(), "Float64": pa.float64(), "Bool": pa.bool_(), "String": pa.string(),
    "LowCardinality(String)": pa.string(),
}


@dataclass(frozen=True)
class Column:
    name: str
    ch_type: str
    arrow_type: pa.DataType
    codec: str = DEFAULT_CODEC


def _ch_of(annotation: Any, metadata: list[Any]) -> str:
    for m in metadata:
        if isinstance(m, CH):
            return m.type
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _ch_of(args[0], list(args[1:]))
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        if len(inner) != 1:
            raise TypeError(f"unsupported union {annotation}")
        return f"Nullable({_ch_of(inner[0], [])})"
    if origin is Literal:
        return "LowCardinality(String)" if all(isinstance(a, str) for a in args) else "UInt8"
    if origin is list:
        return f"Array({_ch_of(args[0], [])})"
    if origin is dict:
        return f"Map({_ch_of(args[0], [])}, {_ch_of(args[1], [])})"
    if annotation is str:
        return "String"
    if annotation is bool:
        return "Bool"
    if annotation is float:
        return "Float64"
    if annotation is int:
        return "Int64"
    raise TypeError(f"no ClickHouse type for {annotation!r}")


def _codec_of(annotation: Any, metadata: list[Any]) -> str:
    """The field's Codec, looked for through Annotated and Optional as its type is; else DEFAULT_CODEC."""
    for m in metadata:
        if isinstance(m, Codec):
            return m.codec
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _codec_of(args[0], list(args[1:]))
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return _codec_of(inner[0], []) if len(inner) == 1 else DEFAULT_CODEC
    return DEFAULT_CODEC


def arrow_type(ch_type: str) -> pa.DataType:
    """The Arrow type the sink sends for a ClickHouse column type."""
    if ch_type.startswith("Nullable("):
        return arrow_type(ch_type[9:-1])
    if ch_type.startswith("Array("):
        return pa.list_(arrow_type(ch_type[6:-1]))
    if ch_type.startswith("Map("):
        k, v = (s.strip() for s in ch_type[4:-1].split(",", 1))
        return pa.map_(arrow_type(k), arrow_type(v))
    return _ARROW[ch_type]


@cache
def model_columns(model: type[Event]) -> tuple[Column, ...]:
    """The stored columns of `model`, in field order."""
    cols = []
    for name, field in model.model_fields.items():
        ch = _ch_of(field.annotation, list(field.metadata))
        cols.append(Column(name, ch, arrow_type(ch), _codec_of(field.annotation, list(field.metadata))))
    return tuple(cols)
