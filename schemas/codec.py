"""The batch envelope and its orjson codec.

One Kafka record = one batch of events of one schema from one node:
  key      the node id (required)
  headers  ct-schema, ct-version, ct-count (the number of events)
  value    a JSON array of events (orjson / pydantic-core, no per-event Python), at most
           MAX_RECORD_BYTES (schemas/topics.py); `schemas.batch_split` cuts bigger batches

`decode_columns` gives the same verdict as columns, through a fast path generated from the models
(schemas/fast_columns.py) where it can vouch for a record.

Decoding validates everything (schemas/envelope_checks.py: count, key, event time) and raises
`DecodeError` with a reason that ends up in `deadletter`; it never raises anything else.
`envelope_checks=False` decodes as before those checks existed (no key, count or event-time rule, values up
to LEGACY_MAX_RECORD_BYTES): for telling whether a record already stored is the one at its offset, or for cutting
an old spooled record into parts that pass them; never for accepting records.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from operator import attrgetter
from typing import Any

from pydantic import TypeAdapter, ValidationError

from clocktower.schemas.envelope_checks import (
    DEFAULT_MAX_FUTURE_SKEW_S,
    count_problem,
    future_problem,
    key_problem,
    timestamp_fields,
)
from clocktower.schemas.event import Event
from clocktower.schemas.fast_columns import decoder
from clocktower.schemas.operations import DeadLetter
from clocktower.schemas.topics import BY_NAME, BY_SCHEMA, MAX_RECORD_BYTES, TELEMETRY  # the limit: defined there

H_SCHEMA = "ct-schema"
H_VERSION = "ct-version"
H_COUNT = "ct-count"
DEFAULT_MAX_FUTURE_SKEW_NS = round(DEFAULT_MAX_FUTURE_SKEW_S * 1e9)
# Before MAX_RECORD_BYTES (1 MiB), decoders took values up to 4 MiB and producers sent messages up to 8 MiB: such
# records may still sit in logs and spools. Without the envelope checks, values up to this size decode.
LEGACY_MAX_RECORD_BYTES = 8 * 1024 * 1024
MAX_BATCH_EVENTS = 100_000
DEADLETTER_RAW_LIMIT = 64 * 1024
# The DeadLetter model's own limits (schemas/column_types.py: Name 256, Text 65536 characters).
NAME_LIMIT = 256
REASON_LIMIT = 65536

Headers = list[tuple[str, bytes]]


class DecodeError(ValueError):
    """A record that cannot be accepted; the message is the dead-letter reason."""


@dataclass(frozen=True)
class DecodedBatch:
    schema: str
    node: str
    events: list[Event]


@dataclass(frozen=True)
class DecodedColumns:
    """A decoded batch as one tuple of values per model field (in field order), each `rows` long."""

    schema: str
    node: str
    rows: int
    columns: list[tuple[Any, ...]]


@cache
def _list_adapter(model: type[Event]) -> TypeAdapter[list[Any]]:
    return TypeAdapter(list[model])  # type: ignore[valid-type]


def encode_batch(events: Sequence[Event], mixed_nodes: bool = False) -> tuple[bytes, bytes, Headers]:
    """(key, value, headers) for a non-empty batch of one schema from one node. `mixed_nodes`: the streams'
    own repartition records, which carry many nodes' events (keyed by the first one's node)."""
    if not events:
        raise ValueError("cannot encode an empty batch")
    model = type(events[0])
    node = events[0].node
    for e in events:
        if type(e) is not model:
            raise ValueError(f"mixed schemas in one batch: {model.SCHEMA} and {type(e).SCHEMA}")
        if e.node != node and not mixed_nodes:
            raise ValueError(f"mixed nodes in one batch: {node} and {e.node}")
    value = _list_adapter(model).dump_json(list(events))
    headers = [(H_SCHEMA, model.SCHEMA.encode()), (H_VERSION, str(model.VERSION).encode()),
               (H_COUNT, str(len(events)).encode())]
    return node.encode(), value, headers


def _header(headers: Sequence[tuple[str, bytes | None]] | None, name: str) -> str | None:
    for k, v in headers or ():
        if k == name:
            return v.decode("utf-8", "replace") if v is not None else None
    return None


def _envelope(topic: str, key: bytes | None, value: bytes | None,
              headers: Sequence[tuple[str, bytes | None]] | None, envelope_checks: bool) -> tuple[str, type[Event]]:
    """The record's (schema, model) once its topic, key, size, schema and version headers pass; else DecodeError."""
    spec = BY_NAME.get(topic)
    if spec is None:
        raise DecodeError(f"unknown topic {topic!r}")
    if value is None:
        raise DecodeError("empty record value")
    if envelope_checks and (problem := key_problem(key)) is not None:
        raise DecodeError(problem)
    limit = MAX_RECORD_BYTES if envelope_checks else LEGACY_MAX_RECORD_BYTES
    if len(value) > limit:
        raise DecodeError(f"oversized record: {len(value)} bytes > {limit}")
    schema = _header(headers, H_SCHEMA)
    if schema is None:
        raise DecodeError(f"missing header {H_SCHEMA}")
    model = BY_SCHEMA[schema].model if schema in BY_SCHEMA else None
    if model is None:
        raise DecodeError(f"unknown schema {schema!r}")
    if model is not spec.model:
        raise DecodeError(f"schema {schema!r} does not belong on topic {topic!r} (expects {spec.model.SCHEMA!r})")
    version = _header(headers, H_VERSION)
    if version != str(model.VERSION):
        raise DecodeError(f"unsupported version {version!r} of schema {schema!r} (supported: {model.VERSION})")
    return schema, model


def decode_batch(topic: str, key: bytes | None, value: bytes | None,
                 headers: Sequence[tuple[str, bytes | None]] | None, *,
                 max_future_skew_ns: int = DEFAULT_MAX_FUTURE_SKEW_NS, now_ns: int | None = None,
                 envelope_checks: bool = True, mixed_nodes: bool = False) -> DecodedBatch:
    """Validate one record of `topic`; raise DecodeError with the reason on any defect.

    An event stamped more than `max_future_skew_ns` after `now_ns` (default: this clock) is refused.
    With `envelope_checks` False, the rules records were stored under before them apply (see the module doc).
    `mixed_nodes`: a record the streams regrouped themselves, whose events come from many nodes (never a node's).
    """
    schema, model = _envelope(topic, key, value, headers, envelope_checks)
    assert value is not None   # _envelope refuses None
    try:
        events = _list_adapter(model).validate_json(value)
    except ValidationError as exc:
        raise DecodeError(_short_reason(exc)) from None
    if not events:
        raise DecodeError("empty batch")
    if len(events) > MAX_BATCH_EVENTS:
        raise DecodeError(f"batch of {len(events)} events exceeds {MAX_BATCH_EVENTS}")
    if envelope_checks and (problem := count_problem(_header(headers, H_COUNT), len(events))) is not None:
        raise DecodeError(problem)
    node = key.decode("utf-8", "replace") if key else events[0].node   # keyless: only without envelope_checks
    for e in () if mixed_nodes else events:
        if e.node != node:
            raise DecodeError(f"event from node {e.node!r} in a batch keyed {bounded(node, 300)!r}")
    if not envelope_checks:
        return DecodedBatch(schema=schema, node=node, events=events)
    fields = timestamp_fields(model, BY_NAME[topic] in TELEMETRY)
    problem = future_problem(events, fields, time.time_ns() if now_ns is None else now_ns, max_future_skew_ns)
    if problem is not None:
        raise DecodeError(problem)
    return DecodedBatch(schema=schema, node=node, events=events)


def decode_columns(topic: str, key: bytes | None, value: bytes | None,
                   headers: Sequence[tuple[str, bytes | None]] | None, *,
                   max_future_skew_ns: int = DEFAULT_MAX_FUTURE_SKEW_NS, now_ns: int | None = None) -> DecodedColumns:
    """`decode_batch`'s verdict, as columns: the same records accepted with the same values, the same reasons.

    Most records take the fast path generated from the model (schemas/fast_columns.py: orjson and whole-column
    checks, no pydantic object per event). A record it cannot vouch for, or one that fails any envelope check,
    goes through `decode_batch`, which accepts it or gives the dead-letter reason.
    """
    schema, model = _envelope(topic, key, value, headers, True)
    fast = decoder(model)
    columns = fast.columns(value) if fast is not None and value is not None else None
    if columns is not None and key:
        rows = len(columns[0])
        node = key.decode("utf-8", "replace")
        limit = (time.time_ns() if now_ns is None else now_ns) + max_future_skew_ns
        by_name = dict(zip(fast.names, columns, strict=True))   # type: ignore[union-attr]
        if (rows <= MAX_BATCH_EVENTS and count_problem(_header(headers, H_COUNT), rows) is None
                and set(by_name["node"]) == {node}
                and all(max(by_name[f]) <= limit for f in timestamp_fields(model, BY_NAME[topic] in TELEMETRY))):
            return DecodedColumns(schema, node, rows, columns)
    batch = decode_batch(topic, key, value, headers, max_future_skew_ns=max_future_skew_ns, now_ns=now_ns)
    columns = list(zip(*map(attrgetter(*model.model_fields), batch.events), strict=True))
    return DecodedColumns(schema, batch.node, len(batch.events), columns)


def _short_reason(exc: ValidationError) -> str:
    errs = exc.errors(include_url=False, include_input=False)
    first = errs[0]
    loc = ".".join(str(p) for p in first.get("loc", ()))
    more = f" (+{len(errs) - 1} more)" if len(errs) > 1 else ""
    return f"invalid {first.get('type')} at {loc or '<root>'}: {first.get('msg')}{more}"[:2000]


def bounded(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, saying how much was cut (a key or reason can be any size)."""
    if len(text) <= limit:
        return text
    tail = f"...[{len(text)} chars]"
    return text[:max(0, limit - len(tail))] + tail


def dead_letter(topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None,
                reason: str, detector: str) -> DeadLetter:
    """The dead-letter event for one rejected record (raw value kept, up to 64 KiB).

    Every text is cut to the model's limits, so that any record, however large its key or
    reason, can be dead-lettered: a dead letter that fails validation would stop its consumer.
    """
    raw = (value or b"")[:DEADLETTER_RAW_LIMIT]
    node = bounded((key or b"").decode("utf-8", "replace"), NAME_LIMIT) or "unknown"
    return DeadLetter(node=node, ts_ns=time.time_ns(), origin_topic=bounded(topic, NAME_LIMIT) or "unknown",
                      origin_partition=min(max(partition, 0), 2**32 - 1), origin_offset=offset,
                      reason=bounded(reason, REASON_LIMIT), detector=bounded(detector, NAME_LIMIT) or "unknown",
                      raw_b64=base64.b64encode(raw).decode())
