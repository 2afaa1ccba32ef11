"""Token buckets: how many datagrams one source may make an agent handle per second, how many refused acks an
actuator publishes per second.

A bucket holds up to `burst` tokens and refills at `rate` per second; each datagram (each refused ack) takes one,
and one that finds the bucket empty is dropped (and counted by the caller). Time is passed in, so the logic is
testable without sleeping.
"""

from __future__ import annotations


class TokenBucket:
    __slots__ = ("rate", "burst", "_tokens", "_last_ns")

    def __init__(self, rate: float, burst: float, now_ns: int) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("rate must be > 0 and burst >= 1")
        self.rate = rate
        self.burst = burst
        self._tokens = burst
        self._last_ns = now_ns

    def take(self, now_ns: int) -> bool:
        """Take one token if there is one."""
        elapsed = max(0, now_ns - self._last_ns)
        self._last_ns = now_ns
        self._tokens = min(self.burst, self._tokens + elapsed * self.rate / 1e9)
        if self._tokens >= 1:
            self._tokens -= 1
            return True
        return False
