"""Events about the pipeline itself: rejected input and injected faults."""

from __future__ import annotations

from typing import ClassVar

from clocktower.schemas.column_types import Int64, Name, Text, TimestampNs, UInt32
from clocktower.schemas.event import Event


class DeadLetter(Event):
    """A record that failed decoding, with why and where it came from.

    `node` is the record's key (or "unknown"), `ts_ns` the rejection time,
    and `raw_b64` the original value, base64-encoded.
    """

    SCHEMA = "deadletter"
    ORDER_BY = ("origin_topic", "origin_partition", "origin_offset")
    REPLACING = True

    origin_topic: Name
    origin_partition: UInt32
    origin_offset: Int64
    reason: Text
    detector: Name
    raw_b64: str


class InjectedFault(Event):
    """Ground truth: a fault the simulator injected, to score detectors against. `detail` is free text ("" = none)."""

    SCHEMA = "injected_fault"
    ORDER_BY: ClassVar[tuple[str, ...]] = ("fault_id",)

    fault_id: Name
    kind: Name
    target: Name
    start_ns: TimestampNs
    end_ns: TimestampNs
    detail: Text = ""


class StreamsTick(Event):
    """A stream worker's clock tick (`node`: the worker's instance id), published every
    CLOCKTOWER_STREAMS_TICK_S to control.ticks and read back by the fleet's replacement allocator.

    Faust timers cannot write tables outside an event, and the allocator acts only on input: without a tick, a
    request the budget withheld would be asked again, or given up as too old, only when the next request or ack
    arrived, which in a quiet fleet may be never. A tick carries no decision of its own: the allocator re-checks,
    by its own wall clock and budget, requests that were themselves accepted. But when it re-checks can decide
    between a grant and giving up (the budget frees just before the fault's age limit), so with
    CLOCKTOWER_PRODUCER_KEY set the streams sign ticks in the worker's name and act only on signed ones, as on
    replacement requests (streams/node_signed_outputs.py). In ClickHouse the ticks also say when each worker
    last ran.
    """

    SCHEMA = "streams_tick"
