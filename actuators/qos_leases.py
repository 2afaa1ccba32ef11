"""How long a node's QoS limit holds without being renewed.

A `rate_limit` or `pause` is held for its congested link (the holder) only for its lease (`lease_s` in the
command's params, else the actuator's default), and the congestion detector sends it again while the congestion
lasts (streams/detectors/congestion.py). So a `resume` that never comes (a streams worker that died before sending
it, a detector whose state was lost) leaves the node's bulk traffic capped for one lease, not for good: the limit
fails open, since an unneeded cap costs throughput while a lifted one only brings back the congestion, which the
detector sees again and limits again.
"""

from __future__ import annotations

DEFAULT_LEASE_S = 60     # without `lease_s` in the command (CLOCKTOWER_ACTUATOR_QOS_LEASE_S)
MAX_LEASE_S = 3600       # a command may not hold a limit longer without renewal
RETRY_NS = 10 * 10**9    # a lift that failed (netlink) is tried again this much later


def lease_ns(text: str | None, default_s: float) -> int:
    """A command's `lease_s` param (absent or empty: `default_s`) in ns; in [1, MAX_LEASE_S] s."""
    if not text:
        return round(default_s * 1e9)
    try:
        seconds = float(text)
    except ValueError:
        raise ValueError(f"lease_s {text!r} is not a number") from None
    if not 1 <= seconds <= MAX_LEASE_S:
        raise ValueError(f"lease_s {seconds:g} is not in [1, {MAX_LEASE_S}] s")
    return round(seconds * 1e9)


class Leases:
    """The holders' deadlines (the actuator's clock, ns)."""

    def __init__(self) -> None:
        self.until: dict[str, int] = {}

    def grant(self, holder: str, now_ns: int, lease: int) -> None:
        self.until[holder] = now_ns + lease

    def drop(self, holder: str) -> None:
        self.until.pop(holder, None)

    def expired(self, now_ns: int) -> list[str]:
        """The holders whose lease ran out, forgotten here (the caller lifts their limits)."""
        gone = sorted(h for h, until in self.until.items() if until <= now_ns)
        for holder in gone:
            del self.until[holder]
        return gone
