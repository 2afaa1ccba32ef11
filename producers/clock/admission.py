"""What a clock-probe agent lets in: each received datagram passes four checks, cheapest first.

1. Source: the sender's IP must be one of the configured peers' (`unlisted_source`). No state is kept
   for anything else.
2. MAC: the datagram must verify with the cluster key (`bad_mac`), and be well formed (`malformed`).
3. Replay: its stamp must be fresh and new for that sender (`stale`, `replayed`; see `replay`).
4. Rate: the source's token bucket must have a token (`rate_limited`). A source is a listed peer's
   host:port, or, for other ports of a listed IP, that IP; so there are at most twice as many buckets
   as peers, and a flood from one node cannot crowd out the others.

Each refusal is counted under the name in parentheses, and nothing else happens: no pair is started,
no probe-back is set up. Only checks 3 and 4 keep state, and only for datagrams that passed 1 and 2.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Iterable

from clocktower.producers.clock.replay import ReplayGuard
from clocktower.producers.clock.wire import AuthError, Message, WireError, decode
from clocktower.runtime.rate_limit import TokenBucket

log = logging.getLogger(__name__)
_LOGGED_PER_KIND = 10


class Admission:
    """Decides, per datagram, whether the agent handles it; counts every refusal in `counts`."""

    def __init__(self, key: bytes, peers: Iterable[tuple], replay_window_ns: int, rate_per_s: float,
                 burst: float, counts: collections.Counter[str]) -> None:
        self._key = key
        self._listed = {p[:2] for p in peers}
        self._ips = {p[0] for p in self._listed}
        self._replay = ReplayGuard(replay_window_ns)
        self._rate = rate_per_s
        self._burst = burst
        self._buckets: dict[tuple, TokenBucket] = {}
        self.counts = counts

    def listed(self, address: tuple) -> bool:
        """Whether host:port is exactly one of the configured peers (probe-back goes only there)."""
        return address[:2] in self._listed

    def admit(self, data: bytes, address: tuple, now_ns: int | None = None) -> Message | None:
        """The verified message, or None when the datagram is refused (and counted)."""
        if address[0] not in self._ips:
            return self._refuse("unlisted_source", address, "not from a configured peer")
        try:
            message = decode(data, self._key)
        except AuthError as exc:
            return self._refuse("bad_mac", address, str(exc))
        except WireError as exc:
            return self._refuse("malformed", address, str(exc))
        why = self._replay.check(message.sender, message.sent_ns)
        if why is not None:
            skew = (message.sent_ns - time.time_ns()) / 1e9
            detail = (f"stamp {skew:+.1f} s off our clock (window {self._replay.window_ns / 1e9:g} s): "
                      f"do the clocks agree?" if why == "stale" else "seen before")
            return self._refuse(why, address, f"{message.sender}: {detail}")
        now = time.monotonic_ns() if now_ns is None else now_ns
        source = address[:2] if address[:2] in self._listed else (address[0], None)
        bucket = self._buckets.get(source)
        if bucket is None:
            bucket = self._buckets[source] = TokenBucket(self._rate, self._burst, now)
        if not bucket.take(now):
            return self._refuse("rate_limited", address, f"more than {self._rate:g} datagrams/s")
        return message

    def _refuse(self, kind: str, address: tuple, why: str) -> None:
        self.counts[kind] += 1
        if self.counts[kind] <= _LOGGED_PER_KIND:
            log.warning("clock-probe datagram from %s dropped (%s): %s", address[:2], kind, why)
        return None
