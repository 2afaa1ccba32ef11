"""Congestion from one-way delay: a `congestion` incident per link and priority class whose queueing delay
exceeds its budget (delay_budget.py), with its evidence, resolved with hysteresis, and QoS on the sender.

When the high class (the collectives) is over its budget on a link src -> dst, the lower class is moved or slowed
first, on the node that sends into the queue: `redirect` {"dst": the congested flow's destination address, "share":
`limit_share`} of its low class (control/traffic_class.py) with the incident's open row. The sender's actuator sends
the low class toward that address out of the alternate port of the port it is routed through, a less loaded path
that skips the measured queue, or, where the node has no alternate, caps it to `limit_share` of the link as a
`rate_limit` would (its ack says which). `pause` of the low class follows if the queue is still over budget
`escalate` samples later (an `update` row); `resume` with the resolve row ends both. A limit or redirect is leased
(`lease_s` LEASE_S, actuators/qos_leases.py): while the congestion lasts its command is sent again every RENEW_NS
of the link's event time (an `update` row), so a `resume` that is lost lifts it one lease later. Every row names
the commands it caused (`command_ids`). A low-class incident orders nothing: there is no lower class to slow.

Reads the joined one-way latencies (analytics.flow_latency), keyed by the receiving node (the records' own key):
every segment of a link src -> dst is received by dst, so one worker holds the link. One state entry per link
(`[src, dst]`): its floor buckets, per class its queueing EWMA, streaks and open incident. Rows without a clock
correction are skipped (counted in `uncorrected`): see delay_budget.py.

The incident's target is "src->dst" (the direction that queues), its node the receiver; the severity is critical
for the high class (the collectives are held up) and warning for the low one. A redelivered row (a segment of the
link read again at a position already applied, or a copy among its newest `SEEN`) changes nothing, and re-emits
what it emitted (the newest `EMITTED` emissions are kept, so a worker killed between writing its state and
publishing does not lose a command). A high-class congestion with no high-priority sample for QUIET_NS (the job
ended or crashed) is resolved and the sender's low class resumed: by the link's next sample, or by the link's
state expiring QUIET_NS after its last one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import orjson

from clocktower.control.intent import CommandIntent, command_id_of
from clocktower.control.traffic_class import SHAPED, traffic_class
from clocktower.schemas.analytics import FlowLatency, Incident
from clocktower.schemas.event import Event
from clocktower.schemas.ids import bounded_name, stable_id
from clocktower.streams.detectors.delay_budget import Change, DelayRule, LinkDelay, observe
from clocktower.streams.detectors.delivery_log import decode_output, encode_output
from clocktower.streams.processor import Output, Processor, compound_key

if TYPE_CHECKING:
    from clocktower.streams.processor_context import ProcessorContext

SEEN = 64
EMITTED = 4
DEFAULT_TTL_NS = 3600 * 10**9
LIMIT_SHARE = 0.25     # where `redirect` finds no alternate path: the low class may use a quarter of the link
ESCALATE = 24          # samples still over budget after the redirect (or its limit) before the low class is paused
QUIET_NS = 10 * 10**9  # an open high-class congestion with no high-priority sample for this long is over
LEASE_S = 60           # how long the sender's actuator holds a limit without renewal
RENEW_NS = 20 * 10**9  # the limit is sent again this often while the congestion lasts (3 per lease)


class CongestionDetector(Processor):
    name: ClassVar[str] = "congestion"
    consumes: ClassVar[tuple[type[Event], ...]] = (FlowLatency,)
    key_by: ClassVar[str] = "node"

    def __init__(self, rule: DelayRule | None = None, ttl_ns: int = DEFAULT_TTL_NS, limit_share: float = LIMIT_SHARE,
                 escalate: int = ESCALATE) -> None:
        self.rule = rule or DelayRule()
        self.limit_share, self.escalate = limit_share, escalate
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
        entry = state.get(key) or {"link": LinkDelay(), "open": {}, "seen": [], "emitted": [], "upto": {}}
        at = state.delivery
        sample = [event.src_port, event.seq, event.tx_ns]
        upto = entry.setdefault("upto", {})
        replayed = at is not None and at.source in upto and [at.offset, at.index] <= upto[at.source]
        if replayed or sample in entry["seen"]:   # read again after a crash (by position), or a copy
            self.redelivered += 1
            return [decode_output(o) for s, outs in entry.get("emitted", []) if s == sample for o in outs]
        if at is not None:
            upto[at.source] = [at.offset, at.index]
        entry["seen"] = [*entry["seen"], sample][-SEEN:]
        link: LinkDelay = entry["link"]
        change = observe(link, event.rx_ns, event.corrected_latency_ns, event.priority, self.rule)
        if traffic_class(event.priority) == "high":
            entry["last_high"] = event.rx_ns
        out = self._rows(event, entry, change) if change else (self._escalate(event, entry)
                                                                or self._renew(event, entry))
        if not out and "high" in entry["open"] and event.rx_ns - entry.get("last_high", event.rx_ns) > QUIET_NS:
            out = self._quiet(entry, event.node, event.src_node, event.ts_ns)   # the collectives stopped
        if out:
            entry["emitted"] = [*entry.get("emitted", []), [sample, [encode_output(o) for o in out]]][-EMITTED:]
        ttl = QUIET_NS if "high" in entry["open"] else self.state_ttl_ns
        state.put(key, entry, event.ts_ns + ttl)
        return list(out)

    def _quiet(self, entry: dict, dst: str, src: str, ts_ns: int) -> list[Output]:
        """No high-priority sample for QUIET_NS while its congestion was open: resolved, and the sender's low class
        resumed (a job that ended or crashed must not leave its neighbours paused)."""
        incident_id, opened, *_ = entry["open"].pop("high")
        link: LinkDelay = entry["link"]
        link.congested["high"], link.over["high"], link.under["high"] = False, 0, 0
        if not any(link.congested.values()):
            link.congested_since = 0
        intent = CommandIntent(node=src, action="resume", target=SHAPED, ts_ns=ts_ns, incident_id=incident_id,
                               params={"toward": dst})
        row = Incident(node=dst, ts_ns=ts_ns, incident_id=incident_id, kind="congestion", state="resolve",
                       severity="info", target=bounded_name(f"{src}->{dst}"), opened_ns=opened,
                       detail=f"no high-priority traffic for {QUIET_NS / 1e9:.0f} s; low class resumed on {src}",
                       evidence=orjson.dumps({"class": "high", "quiet_ns": QUIET_NS}).decode(),
                       command_ids=[command_id_of(intent)])
        return [row, intent]

    def on_expired(self, expired: list[tuple[str, Any]]) -> list[Output]:
        """A link whose high-class congestion was open and that then went quiet altogether: resolve and resume."""
        out: list[Output] = []
        for key, entry in expired:
            if entry is not None and "high" in entry.get("open", {}):
                src, dst = orjson.loads(key)
                out += self._quiet(entry, dst, src, entry.get("last_high", entry["open"]["high"][1]) + QUIET_NS)
        return out

    def _qos(self, ev: FlowLatency, incident_id: str, action: str, path: list[str] | None = None) -> CommandIntent:
        """`path`: the (source, destination) addresses of the high-class flow that opened the congestion, which a
        `redirect` moves the low class off, renewals included (not those of whichever sample comes next)."""
        params = {"share": f"{self.limit_share:g}"} if action in ("rate_limit", "redirect") else {}
        if action == "redirect":
            src, dst = path or [ev.src_ip, ev.dst_ip]
            params["dst"], params["src"] = dst, src
        if action != "resume":
            params["lease_s"] = str(LEASE_S)
        return CommandIntent(node=ev.src_node, action=action, target=SHAPED, ts_ns=ev.ts_ns,   # type: ignore[arg-type]
                             incident_id=incident_id, params={**params, "toward": ev.node})

    def _renew(self, ev: FlowLatency, entry: dict) -> list[Output]:
        """The open high-class congestion's action (its `redirect`, or `pause` once escalated) sent again RENEW_NS
        after the last time, with an `update` row naming it: the actuator holds it only for its lease."""
        opened = entry["open"].get("high")
        if not opened or ev.ts_ns - (opened[3] if len(opened) > 3 else opened[1]) < RENEW_NS:
            return []
        opened[3:] = [ev.ts_ns]
        action = "pause" if len(opened) > 2 and opened[2] else "redirect"
        intent = self._qos(ev, opened[0], action, entry.get("path"))
        evidence = self._evidence(ev, entry, entry["link"].queue.get("high", 0.0), "high")
        return [self._incident(ev, opened[0], opened[1], "update", "critical", "high",
                               f"still congested: the low class's {action} on {ev.src_node} renewed for {LEASE_S} s",
                               evidence, [intent]), intent]

    def _escalate(self, ev: FlowLatency, entry: dict) -> list[Output]:
        """Still over the high budget `escalate` samples after the redirect (or its limit): pause the low class."""
        opened = entry["open"].get("high")
        link: LinkDelay = entry["link"]
        if not opened or len(opened) < 3 or opened[2] or link.over.get("high", 0) < self.rule.sustain + self.escalate:
            return []
        opened[2] = True
        opened[3:] = [ev.ts_ns]   # a new lease
        intent = self._qos(ev, opened[0], "pause")
        return [self._incident(ev, opened[0], opened[1], "update", "critical", "high",
                               f"high-priority queueing still {link.queue['high'] / 1e3:.0f} us: low class paused "
                               f"on {ev.src_node}", self._evidence(ev, entry, link.queue["high"], "high"), [intent]),
                intent]

    def _rows(self, ev: FlowLatency, entry: dict, c: Change) -> list[Output]:
        evidence = self._evidence(ev, entry, c.queue_ns, c.klass, c.baseline_ns, c.budget_ns)
        high = c.klass == "high"
        if c.opened:
            incident_id = stable_id("congestion", f"{ev.src_node}->{ev.node}", c.klass, ev.ts_ns)
            entry["open"][c.klass] = [incident_id, ev.ts_ns, False]
            if high:
                entry["path"] = [ev.src_ip, ev.dst_ip]
            intents = [self._qos(ev, incident_id, "redirect", entry.get("path"))] if high else []
            detail = (f"{c.klass}-priority queueing {c.queue_ns / 1e3:.0f} us over a {c.baseline_ns / 1e3:.1f} us "
                      f"floor, budget {c.budget_ns / 1e3:.0f} us")
            detail += (f"; low class toward {ev.dst_ip} redirected on {ev.src_node} (limited to "
                       f"{self.limit_share:.0%} where it has no alternate path)") if high else ""
            return [self._incident(ev, incident_id, ev.ts_ns, "open", "critical" if high else "warning", c.klass,
                                   detail, evidence, intents), *intents]
        incident_id, opened, *_ = entry["open"].pop(c.klass, [stable_id("congestion", f"{ev.src_node}->{ev.node}",
                                                                         c.klass, ev.ts_ns), ev.ts_ns])
        intents = [self._qos(ev, incident_id, "resume")] if high else []
        detail = f"{c.klass}-priority queueing back to {c.queue_ns / 1e3:.1f} us"
        detail += f"; low class resumed on {ev.src_node}" if high else ""
        return [self._incident(ev, incident_id, opened, "resolve", "info", c.klass, detail, evidence, intents),
                *intents]

    @staticmethod
    def _evidence(ev: FlowLatency, entry: dict, queue_ns: float, klass: str, baseline_ns: int | None = None,
                  budget_ns: int | None = None) -> str:
        return orjson.dumps({"class": klass, "queueing_ns": round(queue_ns),
                             "baseline_ns": entry["link"].baseline() if baseline_ns is None else baseline_ns,
                             "budget_ns": budget_ns, "one_way_ns": ev.corrected_latency_ns,
                             "error_bound_ns": ev.error_bound_ns, "samples": entry["link"].samples}).decode()

    @staticmethod
    def _incident(ev: FlowLatency, incident_id: str, opened_ns: int, state: str, severity: str, klass: str,
                  detail: str, evidence: str, intents: list[CommandIntent]) -> Incident:
        return Incident(node=ev.node, ts_ns=ev.ts_ns, incident_id=incident_id, kind="congestion", state=state,
                        severity=severity, target=bounded_name(f"{ev.src_node}->{ev.node}"), opened_ns=opened_ns,
                        detail=detail, evidence=evidence, command_ids=[command_id_of(i) for i in intents])

    def encode_state(self, value: dict) -> bytes:
        return orjson.dumps(value)   # orjson writes the LinkDelay dataclass itself: the bytes asdict gave, faster

    def decode_state(self, data: bytes) -> dict:
        d = orjson.loads(data)
        return {**d, "link": LinkDelay(**d["link"])}
