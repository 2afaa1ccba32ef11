"""Silent nodes: a `node_silent` incident for a node whose heartbeats stop while its peers' go on.

Every agent sends a `NodeHeartbeat` every `interval_ms` (0.2 s by default). A node is silent once the fleet's
time has run `max(min_silence_ns, MISSED x its interval)` past its last heartbeat, while at least `min_peers`
other nodes have reported within that time: a pipeline that stopped hearing everyone (a broker outage) opens
nothing. The fleet's time is the median of the nodes' newest heartbeats, so a minority of nodes with clocks off,
or replaying a spool, neither hides nor invents a silence. A heartbeat from the node resolves the incident: as
"reports again" when it is newer than the incident, or as "its heartbeats were late, not missing" when it dates
from before (a spool replayed after the others').

A silent node is not a link that went down: a node whose port fails keeps sending (its heartbeats go out of any
working port, and its link reports say which port is down, link_flap.py); a silent node says nothing at all, its
link reports included, so no link incident opens for it.

Keyed by "fleet" (telemetry.heartbeats has one partition): one entry holds every node. A node silent for
`forget_ns` (10 min) is dropped from it, its incident resolved as "no longer tracked" (it left, or it is dead, and a
person decides); its next heartbeat starts it afresh. The check runs in `tick`, after each batch.

Replays: a heartbeat not newer than the node's newest (a copy, or a replay after a crash) changes nothing; if it is
the one that resolved the node's last incident, that resolve row comes again. The rows a tick opened are kept
with the fleet time they were opened at until a new heartbeat is applied, and a tick at that same time after a
batch of nothing new (the same batch read again after a crash) sends them again: same incident ids, so consumers
collapse the copies.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import median_low
from typing import TYPE_CHECKING, Any, ClassVar

import orjson

from clocktower.schemas.analytics import Incident
from clocktower.schemas.event import Event
from clocktower.schemas.ids import bounded_name, stable_id
from clocktower.schemas.telemetry import NodeHeartbeat
from clocktower.streams.processor import Output, Processor

if TYPE_CHECKING:
    from clocktower.streams.processor_context import ProcessorContext

FLEET = "fleet"
MISSED = 5                              # heartbeats missed in a row
DEFAULT_MIN_SILENCE_NS = 10**9          # ... and never less than this
DEFAULT_FORGET_NS = 600 * 10**9
STATE_TTL_NS = 365 * 24 * 3600 * 10**9  # the fleet entry is rewritten by every heartbeat


@dataclass
class Node:
    last_ns: int
    interval_ns: int
    seq: int = 0
    incident: str = ""
    silent_at: int = 0      # the fleet time its incident opened (0: none open)
    resolved_by: int = 0    # the heartbeat that resolved its last incident, and that row (JSON), for a replay
    resolved_row: str = ""


@dataclass
class Fleet:
    nodes: dict[str, Node] = field(default_factory=dict)
    tick_at: int = 0                                    # the fleet time of the last tick that emitted, and its rows
    tick_rows: list[str] = field(default_factory=list)


class SilentNodeDetector(Processor):
    name: ClassVar[str] = "silent_node"
    consumes: ClassVar[tuple[type[Event], ...]] = (NodeHeartbeat,)
    key_by: ClassVar[str] = "fleet (telemetry.heartbeats has one partition)"

    def __init__(self, *, min_silence_ns: int = DEFAULT_MIN_SILENCE_NS, min_peers: int = 2,
                 forget_ns: int = DEFAULT_FORGET_NS) -> None:
        self.min_silence_ns, self.min_peers, self.forget_ns = min_silence_ns, min_peers, forget_ns
        self.state_ttl_ns = STATE_TTL_NS
        self.late = 0          # incidents resolved because the node's heartbeats came late, not missing
        self.forgotten = 0

    @classmethod
    def from_context(cls, ctx: ProcessorContext) -> SilentNodeDetector:
        return cls()

    def partition_key(self, event: Event) -> str:
        return FLEET

    def counters(self) -> dict[str, int]:
        return {"late_heartbeats": self.late, "forgotten_nodes": self.forgotten}

    def process(self, state: Any, event: Event) -> list[Output]:
        assert isinstance(event, NodeHeartbeat)
        fleet: Fleet = state.get(FLEET) or Fleet()
        node = fleet.nodes.get(event.node)
        interval = event.interval_ms * 1_000_000
        if node is None:
            fleet.nodes[event.node] = Node(event.ts_ns, interval, event.seq)
            state.put(FLEET, fleet, event.ts_ns + STATE_TTL_NS)
            return []
        if event.ts_ns <= node.last_ns:   # a copy or a replay: nothing new, but a resolve it made comes again
            return [Incident.model_validate_json(node.resolved_row)] if event.ts_ns == node.resolved_by and \
                node.resolved_row else []
        out: list[Output] = []
        if node.incident:
            late = event.ts_ns <= node.silent_at
            self.late += late
            why = ("its heartbeats were late, not missing" if late else
                   f"reports again after {(event.ts_ns - node.last_ns) / 1e9:.1f} s of silence")
            row = self._row(event.node, node, "resolve", "info", event.ts_ns, why)
            out.append(row)
            node.incident, node.silent_at = "", 0
            node.resolved_by, node.resolved_row = event.ts_ns, row.model_dump_json()
        node.last_ns, node.seq, node.interval_ns = event.ts_ns, event.seq, interval
        fleet.tick_rows = []   # a new heartbeat: this is no replay of the batch that opened them
        state.put(FLEET, fleet, event.ts_ns + STATE_TTL_NS)
        return out

    def tick(self, state: Any, now_ns: int) -> list[Output]:
        state.expire(now_ns)
        fleet: Fleet | None = state.get(FLEET)
        if fleet is None or len(fleet.nodes) <= self.min_peers:
            return []
        now = median_low(n.last_ns for n in fleet.nodes.values())
        if now == fleet.tick_at and fleet.tick_rows:   # the same batch again (a replay): the same rows
            return [Incident.model_validate_json(r) for r in fleet.tick_rows]
        out: list[Incident] = []
        forgot = False
        for name, node in list(fleet.nodes.items()):
            silence = now - node.last_ns
            if silence > self.forget_ns:
                del fleet.nodes[name]
                self.forgotten += 1
                forgot = True
                if node.incident:
                    out.append(self._row(name, node, "resolve", "info", now, f"silent for {silence / 1e9:.0f} s: "
                                         "no longer tracked (it left the fleet, or it is dead)"))
                continue
            limit = self.limit(node)
            if node.incident or silence <= limit:
                continue
            peers = sum(1 for other, n in fleet.nodes.items() if other != name and now - n.last_ns <= limit)
            if peers < self.min_peers:
                continue
            node.incident = stable_id("node_silent", name, node.last_ns)
            node.silent_at = now
            out.append(self._row(name, node, "open", "critical", now,
                                 f"no heartbeat for {silence / 1e9:.1f} s (expected every "
                                 f"{node.interval_ns / 1e6:.0f} ms) while {peers} other nodes report",
                                 {"last_heartbeat_ns": node.last_ns, "silence_ms": silence / 1e6,
                                  "interval_ms": node.interval_ns / 1e6, "peers_reporting": peers,
                                  "last_seq": node.seq}))
        if out:
            fleet.tick_at, fleet.tick_rows = now, [r.model_dump_json() for r in out]
        if out or forgot:
            state.put(FLEET, fleet, now + STATE_TTL_NS)
        return list(out)

    def limit(self, node: Node) -> int:
        return max(self.min_silence_ns, MISSED * node.interval_ns)

    @staticmethod
    def _row(name: str, node: Node, state: str, severity: str, ts_ns: int, detail: str,
             evidence: dict | None = None) -> Incident:
        return Incident(node=name, ts_ns=ts_ns, incident_id=node.incident, kind="node_silent", state=state,
                        severity=severity, target=bounded_name(name), opened_ns=node.silent_at, detail=detail,
                        evidence=orjson.dumps(evidence).decode() if evidence else "")

    def encode_state(self, value: Fleet) -> bytes:
        return orjson.dumps({"nodes": {n: [x.last_ns, x.interval_ns, x.seq, x.incident, x.silent_at, x.resolved_by,
                                           x.resolved_row] for n, x in value.nodes.items()},
                             "tick": [value.tick_at, value.tick_rows]})

    def decode_state(self, data: bytes) -> Fleet:
        d = orjson.loads(data)
        return Fleet({n: Node(*v) for n, v in d["nodes"].items()}, *d["tick"])
