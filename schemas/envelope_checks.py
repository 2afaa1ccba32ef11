"""Checks a record must pass beyond its events' own validation: count header, key, event time.

They guard against third-party producers: a batch whose `ct-count` disagrees with its events was cut
or padded on the way; a keyless record breaks per-node ordering and partitioning; an event stamped
far in the future would sit at the top of every dashboard and outlive its table's TTL. Each check is
pure and returns None when the record passes, else the dead-letter reason.

Which timestamps: `ts_ns` on every event (the table's `time` column). On telemetry topics, which
carry observations of the past, every other timestamp field too (a probe's tx/rx, a collective's
start/end). Not elsewhere: a control command's `expires_ns` and a scheduled fault's `end_ns` are
in the future by design.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import get_args

from clocktower.schemas.column_types import TimestampNs
from clocktower.schemas.event import Event

DEFAULT_MAX_FUTURE_SKEW_S = 30.0   # node clocks must agree within 30 s (clock sync's probes refuse more); a day let
                                   # 8 readings dated 23 h ahead blind a node's detectors for that day (issue 18)
_TS_BOUNDS = get_args(TimestampNs)[1].metadata   # [Ge, Le]: what marks a field as a TimestampNs


def count_problem(header: str | None, events: int) -> str | None:
    """The `ct-count` header must be present and equal the number of events in the value."""
    if header is None:
        return "missing header ct-count"
    if not (header.isascii() and header.isdigit()) or int(header) != events:
        return f"ct-count {header[:40]!r} does not match the {events} events in the batch"
    return None


def key_problem(key: bytes | None) -> str | None:
    """A record must be keyed (by its node): a keyless one has no partition of its own."""
    return "record has no key (the node id)" if not key else None


@cache
def timestamp_fields(model: type[Event], observations: bool) -> tuple[str, ...]:
    """`ts_ns`, plus every other TimestampNs field when the model's events are observations of the past."""
    if not observations:
        return ("ts_ns",)
    return tuple(name for name, f in model.model_fields.items() if all(b in f.metadata for b in _TS_BOUNDS))


def future_problem(events: Sequence[Event], fields: tuple[str, ...], now_ns: int, max_skew_ns: int) -> str | None:
    """No checked timestamp may be more than `max_skew_ns` ahead of `now_ns` (the decoder's clock)."""
    limit = now_ns + max_skew_ns
    for i, e in enumerate(events):
        for name in fields:
            ts = getattr(e, name)
            if ts > limit:
                return (f"event {i}: {name} {ts} is {(ts - now_ns) / 1e9:.3f} s ahead of the decoder's clock "
                        f"(at most {max_skew_ns / 1e9:.0f} s allowed: CLOCKTOWER_MAX_FUTURE_SKEW_S)")
    return None
