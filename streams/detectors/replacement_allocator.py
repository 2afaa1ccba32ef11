"""The fleet's one allocator of node replacements: the budget, and which spare replaces which node.

The GPU detector runs per node, on whichever worker owns the node's partition, so it cannot count the
fleet's replacements nor see which spares the other nodes took: it asks (`ReplacementRequest`). This
processor reads every request under one key ("fleet", on the one partition of control.replacements), so one
worker decides them all, in order, with its state in a changelogged table: the budget's grants and the
spares in use hold across all workers and survive a restart.

A request, unless its node is already being replaced, is granted within the fleet's RemediationBudget; a
granted one orders `drain` (to the faulty node) and `spare` {"replaces": node} to the first spare of the
configured pool that replaces no other node (never the faulty node itself). The answer is an `update` row
of the requesting incident naming the commands (or saying why there are none). A spare is free again once
the node it replaces acks an applied `undrain` (`clocktower control undrain NODE`, after the repair).

Acks come from the nodes, and a node could forge one for itself: it can free only the spare that replaces
it (a spare's hook should still refuse a second activation). A redelivered request is answered with the
same outputs (same incident row, same command ids) without asking the budget again; the newest `ANSWERED`
answers are kept for that.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import orjson

from clocktower.control.intent import CommandIntent, command_id_of
from clocktower.schemas.analytics import Incident
from clocktower.schemas.control import ControlAck, ReplacementRequest
from clocktower.schemas.event import Event
from clocktower.schemas.ids import bounded_name
from clocktower.streams.detectors.delivery_log import Emitted, decode_output, encode_output
from clocktower.streams.processor import Output, Processor
from clocktower.streams.remediation_budget import RemediationBudget

if TYPE_CHECKING:
    from clocktower.streams.processor_context import ProcessorContext

FLEET = "fleet"
ANSWERED = 32                      # newest answers kept for redelivered requests
STATE_TTL_NS = 365 * 24 * 3600 * 10**9   # the fleet's entry is rewritten by every request; never let it lapse


@dataclass
class Fleet:
    granted: list[int] = field(default_factory=list)          # the budget's grants (processing clock, ns)
    replaced: dict[str, str] = field(default_factory=dict)    # node being replaced -> its spare ("" = none)
    answered: list[tuple[str, Emitted]] = field(default_factory=list)   # (incident id, outputs), oldest first


class ReplacementAllocator(Processor):
    name: ClassVar[str] = "replacement_allocator"
    consumes: ClassVar[tuple[type[Event], ...]] = (ReplacementRequest, ControlAck)
    key_by: ClassVar[str] = "fleet"

    def __init__(self, *, budget: RemediationBudget | None = None, spare_nodes: tuple[str, ...] = ()) -> None:
        self.budget = budget if budget is not None else RemediationBudget()
        self.spare_nodes = tuple(spare_nodes)
        self.redelivered = 0
        self.spares_freed = 0

    @classmethod
    def from_context(cls, ctx: ProcessorContext) -> ReplacementAllocator:
        return cls(budget=ctx.remediation_budget, spare_nodes=ctx.spare_nodes)

    def partition_key(self, event: Event) -> str:
        return FLEET

    def counters(self) -> dict[str, int]:
        return {"redelivered": self.redelivered, "spares_freed": self.spares_freed}

    def process(self, state: Any, event: Event) -> list[Output]:
        fleet: Fleet = state.get(FLEET) or Fleet()
        if isinstance(event, ControlAck):
            if event.action == "undrain" and event.status == "applied" and event.node in fleet.replaced:
                del fleet.replaced[event.node]
                self.spares_freed += 1
                state.put(FLEET, fleet, state.now_ns + STATE_TTL_NS)
            return []
        assert isinstance(event, ReplacementRequest)
        done = next((out for incident_id, out in fleet.answered if incident_id == event.incident_id), None)
        if done is not None:
            self.redelivered += 1
            return list(done)
        out = self._answer(fleet, event)
        fleet.answered = [*fleet.answered, (event.incident_id, out)][-ANSWERED:]
        state.put(FLEET, fleet, max(state.now_ns, event.ts_ns) + STATE_TTL_NS)
        return list(out)

    def _answer(self, fleet: Fleet, req: ReplacementRequest) -> Emitted:
        if req.node in fleet.replaced:
            spare = fleet.replaced[req.node]
            return [self._row(req, "the node is already being replaced" + (f" by {spare}" if spare else "")
                              + ": no second drain or spare")]
        if not self.budget.allow(fleet.granted):
            b = self.budget
            return [self._row(req, f"drain and spare withheld, needs human approval: the fleet limit of "
                                   f"{b.max_per_window} replacements per {b.window_ns / 1e9:g} s is reached")]
        cmds = [CommandIntent(req.node, "drain", req.node, req.ts_ns, req.incident_id,
                              {"reason": req.reason, "gpu": str(req.gpu)})]
        in_use = set(fleet.replaced.values())
        spare = next((n for n in self.spare_nodes if n != req.node and n not in in_use), "")
        if spare:
            cmds.append(CommandIntent(spare, "spare", spare, req.ts_ns, req.incident_id, {"replaces": req.node}))
            detail = f"drain ordered, spare {spare} ordered"
        elif self.spare_nodes:
            detail = (f"drain ordered; no free spare: the pool's {len(self.spare_nodes)} spares replace other "
                      "nodes (one is freed by `clocktower control undrain` of the node it replaces)")
        else:
            detail = "drain ordered; no spare node configured (CLOCKTOWER_STREAMS_SPARE_NODES): no spare ordered"
        fleet.replaced[req.node] = spare
        return [self._row(req, detail, [command_id_of(c) for c in cmds]), *cmds]

    @staticmethod
    def _row(req: ReplacementRequest, detail: str, command_ids: list[str] | None = None) -> Incident:
        return Incident(node=req.node, ts_ns=req.ts_ns, incident_id=req.incident_id, kind=req.reason,
                        state="update", severity="critical", target=bounded_name(f"{req.node}/gpu{req.gpu}"),
                        opened_ns=req.ts_ns, detail=detail, command_ids=command_ids or [])

    def encode_state(self, value: Fleet) -> bytes:
        return orjson.dumps({"granted": value.granted, "replaced": value.replaced,
                             "answered": [[i, [encode_output(o) for o in out]] for i, out in value.answered]})

    def decode_state(self, data: bytes) -> Fleet:
        d = orjson.loads(data)
        return Fleet(d["granted"], d["replaced"], [(i, [decode_output(o) for o in out]) for i, out in d["answered"]])
