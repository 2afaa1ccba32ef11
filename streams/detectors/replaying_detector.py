"""What the node-keyed detectors share: entries that carry a DeliveryLog, their codec, TTL and counts.

A detector's entry (a port, a GPU) is a dataclass with a `log: DeliveryLog` field (delivery_log.py): a
redelivered report is not applied again and re-emits what it emitted. Each subclass says which entry class it
keeps and when an entry holds an open incident, so an entry that expires with one open is counted.
"""

from __future__ import annotations

from typing import Any, ClassVar

from clocktower.streams.detectors.delivery_log import decode_entry, encode_entry
from clocktower.streams.processor import Output, Processor


class ReplayingDetector(Processor):
    entry: ClassVar[type]   # the dataclass of one state entry

    def __init__(self, ttl_ns: int) -> None:
        self.state_ttl_ns = ttl_ns
        self.redelivered = 0     # reports already applied: not applied again, their outputs re-emitted
        self.expired_open = 0    # entries that expired with an incident open

    def is_open(self, entry: Any) -> bool:
        """Whether the entry holds an open incident."""
        raise NotImplementedError

    def counters(self) -> dict[str, int]:
        return {"redelivered": self.redelivered, "expired_open": self.expired_open}

    def on_expired(self, expired: list[tuple[str, Any]]) -> list[Output]:
        self.expired_open += sum(1 for _, e in expired if e is not None and self.is_open(e))
        return []

    def encode_state(self, value: Any) -> bytes:
        return encode_entry(value)

    def decode_state(self, data: bytes) -> Any:
        return decode_entry(self.entry, data)
