"""Replay protection for clock-probe datagrams: per-sender stamps that only grow, checked by the receiver.

Each agent stamps every datagram it sends with `SendClock.stamp()`: the wall clock in ns, bumped by one
when it would not exceed the previous stamp, so a process never uses a stamp twice, and a restarted
agent starts past the stamps it used before (unless the wall clock stepped back meanwhile). The stamp is
covered by the MAC (see `wire`).

`ReplayGuard` accepts a stamp from a sender only if it is
- fresh: within `window_ns` of the receiver's wall clock (so a datagram captured earlier cannot be
  replayed later, not even to a receiver that restarted and forgot what it saw), and
- new: above the lowest of the last `keep` stamps accepted from that sender and not one of them. This
  tolerates a little reordering and rejects every duplicate.
The table holds at most `max_senders` senders (least recently heard dropped first). It is only fed
datagrams whose MAC verified, so only key holders can add to it.
"""

from __future__ import annotations

import bisect
import time
from collections import OrderedDict


class SendClock:
    """Strictly increasing wall-clock stamps (ns) for the datagrams one agent sends."""

    def __init__(self) -> None:
        self._last = 0

    def stamp(self) -> int:
        now = time.time_ns()
        self._last = now if now > self._last else self._last + 1
        return self._last


class ReplayGuard:
    """Remembers the newest stamps per sender; `check` says why a stamp is refused, or None and records it."""

    def __init__(self, window_ns: int, keep: int = 64, max_senders: int = 4096) -> None:
        if window_ns <= 0 or keep < 1 or max_senders < 1:
            raise ValueError("window_ns, keep and max_senders must be positive")
        self.window_ns = window_ns
        self.keep = keep
        self.max_senders = max_senders
        self._seen: OrderedDict[str, list[int]] = OrderedDict()

    def check(self, sender: str, sent_ns: int, now_ns: int | None = None) -> str | None:
        """None if the stamp is fresh and new (then it is remembered); else "stale" or "replayed"."""
        now = time.time_ns() if now_ns is None else now_ns
        if abs(sent_ns - now) > self.window_ns:
            return "stale"
        kept = self._seen.get(sender)
        if kept is None:
            if len(self._seen) >= self.max_senders:
                self._seen.popitem(last=False)
            self._seen[sender] = [sent_ns]
            return None
        self._seen.move_to_end(sender)
        at = bisect.bisect_left(kept, sent_ns)
        if at == 0 or (at < len(kept) and kept[at] == sent_ns):
            return "replayed"                 # a duplicate, or older than everything we still remember
        kept.insert(at, sent_ns)
        if len(kept) > self.keep:
            del kept[0]
        return None

    def __len__(self) -> int:
        return len(self._seen)
