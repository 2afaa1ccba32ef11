"""Congestion from one-way delay: a `congestion` incident per link and priority class whose queueing delay
exceeds its budget (delay_budget.py), with its evidence, resolved with hysteresis.

Reads the joined one-way latencies (analytics.flow_latency), keyed by the receiving node (the records' own key):
every segment of a link src -> dst is received by dst, so one worker holds the link. One state entry per link
(`[src, dst]`): its floor buckets, per class its queueing EWMA, streaks and open incident. Rows without a clock
correction are skipped (counted in `uncorrected`): see delay_budget.py.

The incident's target is "src->dst" (the direction that queues), its node the receiver; the severity is critical
for the high class (the collectives are held up) and warning for the low one. A redelivered row (a segment of the
link seen among its newest `SEEN`) changes nothing.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any, ClassVar

import orjson

from clocktower.schemas.analytics import FlowLatency, Incident
from clocktower.schemas.event import Event
from clocktower.schemas.ids import bounded_name, stable_id
from clocktower.streams.detectors.delay_budget import Change, DelayRule, LinkDelay, observe
from clocktower.streams.processor import Output, Processor, compound_key

if TYPE_CHECKING:
    from clocktower.streams.processor_context import ProcessorContext

SEEN = 64
DEFAULT_TTL_NS = 3600 * 10**9


class CongestionDetector(Processor):
    name: ClassVar[str] = "congestion"
    consumes: ClassVar[tuple[type[Event], ...]] = (FlowLatency,)
    key_by: ClassVar[str] = "node"

    def __init__(self, rule: DelayRule | None = None, ttl_ns: int = DEFAULT_TTL_NS) -> None:
        self.rule = rule or DelayRule()
        self.state_ttl_ns = ttl_ns
        self.uncorrected = 0
        self.redelivered = 0

    @classmethod
    def from_context(cls, ctx: ProcessorContext) -> CongestionDetector:
        return cls()

    def counters(self) -> dict[str, int]:
        return {"uncorrected": self.uncorrected, "redelivered": self.redelivered}

    def process(self, state: Any, event: Event) -> list[Output]:
        assert isinstance(event, FlowLatency)
        if not event.clock_corrected or event.corrected_latency_ns is None:
            self.uncorrected += 1
            return []
        key = compound_key(event.src_node, event.node)
        entry = state.get(key) or {"link": LinkDelay(), "open": {}, "seen": []}
        sample = [event.src_port, event.seq, event.tx_ns]
        if sample in entry["seen"]:
            self.redelivered += 1
            return []
        entry["seen"] = [*entry["seen"], sample][-SEEN:]
        change = observe(entry["link"], event.rx_ns, event.corrected_latency_ns, event.priority, self.rule)
        out = [self._row(event, entry, change)] if change else []
        state.put(key, entry, event.ts_ns + self.state_ttl_ns)
        return list(out)

    def _row(self, ev: FlowLatency, entry: dict, c: Change) -> Incident:
        target = bounded_name(f"{ev.src_node}->{ev.node}")
        evidence = orjson.dumps({"class": c.klass, "queueing_ns": round(c.queue_ns), "baseline_ns": c.baseline_ns,
                                 "budget_ns": c.budget_ns, "one_way_ns": ev.corrected_latency_ns,
                                 "error_bound_ns": ev.error_bound_ns, "samples": entry["link"].samples}).decode()
        if c.opened:
            incident_id = stable_id("congestion", target, c.klass, ev.ts_ns)
            entry["open"][c.klass] = [incident_id, ev.ts_ns]
            return Incident(node=ev.node, ts_ns=ev.ts_ns, incident_id=incident_id, kind="congestion", state="open",
                            severity="critical" if c.klass == "high" else "warning", target=target,
                            opened_ns=ev.ts_ns, detail=f"{c.klass}-priority queueing {c.queue_ns / 1e3:.0f} us over "
                            f"a {c.baseline_ns / 1e3:.1f} us floor, budget {c.budget_ns / 1e3:.0f} us",
                            evidence=evidence)
        incident_id, opened = entry["open"].pop(c.klass, ["", ev.ts_ns])
        return Incident(node=ev.node, ts_ns=ev.ts_ns, incident_id=incident_id or stable_id(
                            "congestion", target, c.klass, opened), kind="congestion", state="resolve",
                        severity="info", target=target, opened_ns=opened,
                        detail=f"{c.klass}-priority queueing back to {c.queue_ns / 1e3:.1f} us", evidence=evidence)

    def encode_state(self, value: dict) -> bytes:
        return orjson.dumps({**value, "link": asdict(value["link"])})

    def decode_state(self, data: bytes) -> dict:
        d = orjson.loads(data)
        return {**d, "link": LinkDelay(**d["link"])}
