"""What a batch's timers fired, kept for a replay of the report it was published with.

Outputs fired by time (a watchdog, a restore) belong to no report, yet they are published with the batch. If
the worker dies after writing its state (the timers gone) but before its commit, the batch's reports are
replayed and must bring those outputs back. So they are stored under the batch's newest applied report, in
entries of their own rather than in that report's link entry: a fleet-wide event can fire hundreds in one
tick, and a link entry is rewritten with every report of its link. Here they are written once, in chunks of
`CHUNK` outputs (small records), and expire by themselves after `KEEP_NS` of the partition's event time,
far longer than a batch stays uncommitted (unless the partition's time jumps an hour ahead within one
uncommitted batch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from clocktower.streams.detectors.delivery_log import Emitted, decode_output, encode_output
from clocktower.streams.processor import compound_key

CHUNK = 32                      # outputs per entry (an incident and its command: ~1 KB of JSON)
KEEP_NS = 3600 * 10**9          # event time a firing stays replayable (an hour: a catch-up runs event time
                                # fast, and the entries are small and written once)
PREFIX = b'{"fired"'


@dataclass
class FiredChunk:
    outputs: Emitted


def _key(report_key: str, ts_ns: int, i: int) -> str:
    return compound_key("fired", report_key, ts_ns, i)


def fired_with(state: Any, report_key: str, ts_ns: int) -> Emitted:
    """What the timers fired in the batch of the report `report_key` at `ts_ns`; [] if none (or expired)."""
    out: Emitted = []
    i = 0
    while (chunk := state.get(_key(report_key, ts_ns, i))) is not None:
        out += chunk.outputs
        i += 1
    return out


def log_fired(state: Any, report_key: str, ts_ns: int, fired: Emitted, now_ns: int) -> None:
    """Add `fired` to what the report at `ts_ns` was published with."""
    i = 0
    while state.get(_key(report_key, ts_ns, i)) is not None:
        i += 1
    for start in range(0, len(fired), CHUNK):
        state.put(_key(report_key, ts_ns, i), FiredChunk(list(fired[start:start + CHUNK])), now_ns + KEEP_NS,
                  capped=False)   # what kept ports fired: never refused (state_store.py)
        i += 1


def encode(chunk: FiredChunk) -> bytes:
    return orjson.dumps({"fired": [encode_output(o) for o in chunk.outputs]})


def decode(data: bytes) -> FiredChunk:
    return FiredChunk([decode_output(o) for o in orjson.loads(data)["fired"]])
