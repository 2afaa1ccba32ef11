"""Acknowledged records, kept a little longer in case the broker loses them.

Why: an ack is not always durable. The embedded broker (noida-db) acknowledges with acks=all before it
writes; it writes its whole state about once a second, so a kill -9 loses what it acked in the last
second or more (more as its log grows), and hands those offsets out again. A SpoolingPublisher keeps each
acked record here for `hold_s`. If the broker goes away meanwhile, the held records go back to the spool
as "in doubt": after the broker is back the publisher reads the topics back and resends only the records
whose ct-rid it does not find. Bounded by bytes: past `max_bytes` the oldest are let go early.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from clocktower.producers.spool import SpoolRecord

# (record, partition, offset): an acked record is let go, so it is no longer resent if the broker loses it
OnRelease = Callable[[SpoolRecord, int, int], None]


class AckHold:
    def __init__(self, hold_s: float, max_bytes: int = 64 * 1024 * 1024, on_release: OnRelease | None = None) -> None:
        self.hold_s = hold_s
        self.max_bytes = max_bytes
        self.on_release = on_release
        self._held: deque[tuple[float, SpoolRecord, int, int]] = deque()
        self._bytes = 0
        self.released_early = 0            # let go before hold_s because of max_bytes

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, rec: SpoolRecord, now: float, partition: int = -1, offset: int = -1) -> None:
        """Hold `rec`, acked at `offset` of its topic's `partition`."""
        if self.hold_s <= 0:
            if self.on_release is not None:
                self.on_release(rec, partition, offset)
            return
        self._held.append((now + self.hold_s, rec, partition, offset))
        self._bytes += len(rec.value)
        while self._bytes > self.max_bytes and self._held:
            self._pop()
            self.released_early += 1

    def release(self, now: float) -> None:
        """Let go of the records held for their whole hold_s: the broker has had time to store them."""
        while self._held and self._held[0][0] <= now:
            self._pop()

    def take_all(self) -> list[SpoolRecord]:
        """Every held record, oldest ack first; the hold is empty afterwards."""
        out = [rec for _, rec, _, _ in self._held]
        self._held.clear()
        self._bytes = 0
        return out

    def _pop(self) -> None:
        _, rec, partition, offset = self._held.popleft()
        self._bytes -= len(rec.value)
        if self.on_release is not None:
            self.on_release(rec, partition, offset)
