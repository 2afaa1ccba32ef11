"""Is a link congested? Its one-way queueing delay against its own floor, per priority class, with a budget each.

One-way delay on a link = propagation and serialization (its floor) + queueing. The floor is the link's windowed
minimum of corrected one-way delay (`WINDOW_NS` in `BUCKETS` buckets, so it follows a path change within a
window and a single low outlier leaves with its bucket; while the link is congested no bucket is added or aged
out, so a congestion does not become the floor, for up to FREEZE_MAX_NS: a rise that lasts longer is the path's
new delay, and becomes it); queueing is what a sample has above it. A link is
congested for a class when the class's queueing delay (an EWMA of its samples, so one late packet is not
congestion) stays above the class's budget for `sustain` samples in a row, and clear again once it stays under
half the budget for as long (hysteresis).

Budgets are per traffic class (control/traffic_class.py): high (skb priority 3 and up, or HTB class 1:10; the
collectives) is allowed `high_budget_ns` of queueing, low (bulk, checkpoints, data loading) `low_budget_ns`. The
budget that is exceeded says whose traffic suffers: the QoS answer is to slow the lower classes first.

Only clock-corrected samples are judged: a raw one-way delay carries the two clocks' offset, which drifts by
microseconds a second, far more than a budget.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from clocktower.control.traffic_class import traffic_class

WINDOW_NS = 30 * 10**9
BUCKETS = 10
FREEZE_MAX_NS = 2 * WINDOW_NS   # the floor holds while congested, but not longer than this: a lasting rise of the
                                # path's delay (a route change, a clock-correction step) must become the floor
EWMA_ALPHA = 0.2


@dataclass
class DelayRule:
    high_budget_ns: int = 25_000
    low_budget_ns: int = 250_000
    sustain: int = 8

    def budget(self, priority: int | None) -> int:
        return self.high_budget_ns if traffic_class(priority) == "high" else self.low_budget_ns

    def klass(self, priority: int | None) -> str:
        return traffic_class(priority)


@dataclass
class LinkDelay:
    """One link's floor buckets [[start_ns, min_ns], ...], and per class its queueing EWMA and streaks."""

    floor: list[list[int]] = field(default_factory=list)
    queue: dict[str, float] = field(default_factory=dict)
    over: dict[str, int] = field(default_factory=dict)
    under: dict[str, int] = field(default_factory=dict)
    congested: dict[str, bool] = field(default_factory=dict)
    samples: int = 0
    congested_since: int = 0   # when the first class became congested (0: none is)

    def baseline(self) -> int | None:
        return min(m for _, m in self.floor) if self.floor else None


@dataclass
class Change:
    klass: str
    opened: bool
    queue_ns: float
    baseline_ns: int
    budget_ns: int


def observe(link: LinkDelay, ts_ns: int, delay_ns: int, priority: int | None, rule: DelayRule) -> Change | None:
    """Add one corrected delay sample of the link; a Change when the class became congested or clear."""
    width = WINDOW_NS // BUCKETS
    start = ts_ns - ts_ns % width
    if link.floor and link.floor[-1][0] == start:
        link.floor[-1][1] = min(link.floor[-1][1], delay_ns)
    elif (not link.floor or start > link.floor[-1][0]) and (
            not any(link.congested.values()) or ts_ns - link.congested_since > FREEZE_MAX_NS):
        link.floor.append([start, delay_ns])   # while congested the floor holds: queueing must not become it
        link.floor = [b for b in link.floor if b[0] > start - WINDOW_NS]
    else:   # an older sample, or congested: it may only lower a bucket's floor
        for b in link.floor:
            if b[0] == start:
                b[1] = min(b[1], delay_ns)
    link.samples += 1
    base = link.baseline()
    assert base is not None
    k = rule.klass(priority)
    q = link.queue.get(k, 0.0)
    q += EWMA_ALPHA * (max(0, delay_ns - base) - q)
    link.queue[k] = q
    budget = rule.budget(priority)
    if q > budget:
        link.over[k], link.under[k] = link.over.get(k, 0) + 1, 0
    elif q < budget / 2:
        link.under[k], link.over[k] = link.under.get(k, 0) + 1, 0
    else:
        link.over[k] = link.under[k] = 0
    if not link.congested.get(k) and link.over.get(k, 0) >= rule.sustain:
        if not any(link.congested.values()):
            link.congested_since = ts_ns
        link.congested[k] = True
        return Change(k, True, q, base, budget)
    if link.congested.get(k) and link.under.get(k, 0) >= rule.sustain:
        link.congested[k] = False
        if not any(link.congested.values()):
            link.congested_since = 0
        return Change(k, False, q, base, budget)
    return None
