"""The two traffic classes that congestion control shares between the streams and the actuators.

Traffic is "high" (the collectives: held up, they stall every rank) or "low" (bulk: checkpoints, data loading,
logs), by the packet's skb->priority. The actuator shapes a node's egress with an HTB qdisc of its own handle
(c7:, chosen so as not to take an operator's 1:) whose classes are c7:10 (high, served first) and c7:20 (low, the
default), and HTB puts a packet whose skb->priority is one of its class ids straight into that class: the agent's
tc classifier sets skb->priority per flow (its `prio` map), or an application sets it with SO_PRIORITY (0xc70010).
A plain small priority (SO_PRIORITY 0-6, as NCCL's traffic class setting gives) counts as high from HIGH_PRIORITY
up, for judging delay; to be *shaped* as high it must be marked c7:10.

Only the low class is ever slowed: `rate_limit` caps its share of the link, `pause` holds it to a trickle, `resume`
gives it the whole link back.
"""

from __future__ import annotations

from typing import Literal

TrafficClass = Literal["high", "low"]
HANDLE = 0xC7            # the actuator's HTB qdisc: c7:
HIGH_CLASSID = HANDLE << 16 | 0x10   # HTB class c7:10
LOW_CLASSID = HANDLE << 16 | 0x20    # HTB class c7:20, the qdisc's default
HIGH_PRIORITY = 3        # a plain skb priority from which traffic is high
SHAPED: TrafficClass = "low"
PAUSED_SHARE = 0.0       # `pause`: the low class keeps only a trickle (HTB cannot stop a class outright)


def traffic_class(priority: int | None) -> TrafficClass:
    """The class of traffic sent with skb->priority `priority` (None: unknown, low)."""
    if priority is None:
        return "low"
    if priority >> 16 == HANDLE:   # a class id of the actuator's qdisc
        return "high" if priority == HIGH_CLASSID else "low"
    return "high" if priority >= HIGH_PRIORITY else "low"


def parse_share(text: str) -> float:
    """A `rate_limit` command's `share` param: the fraction of the link the low class may use, in (0, 1]."""
    try:
        share = float(text)
    except ValueError:
        raise ValueError(f"share {text!r} is not a number") from None
    if not 0 < share <= 1:
        raise ValueError(f"share {share} is not in (0, 1]")
    return share
