"""The fleet's one allocator of node replacements: the budget, and which spare replaces which node.

The GPU detector runs per node, on whichever worker owns the node's partition, so it cannot count the
fleet's replacements nor see which spares the other nodes took: it asks (`ReplacementRequest`). This
processor reads every request under one key ("fleet", on the one partition of control.replacements), so one
worker decides them all, in order, with its state in a changelogged table: the budget's grants and the
spares in use hold across all workers and survive a restart.

A request, unless its node is already being replaced, is granted within the fleet's RemediationBudget; a
granted one orders `drain` (to the faulty node) and `spare` {"replaces": node} to the first spare of the
configured pool that replaces no other node and is not itself being replaced (never the faulty node). The
answer is an `update` row of the requesting incident naming the commands (or saying why there are none). A
spare is free again once the node it replaces acks an applied `undrain` dated after the grant
(`clocktower control undrain NODE`, after the repair). That undrain's time is kept per node (the newest `RETURNED`
nodes): a request for a fault dated before it orders nothing, so a captured request replayed after the repair is
not granted again (it once was: it spent budget, and its node's next real fault got "already being replaced").

A request over the budget is withheld and asked for again, oldest first, at the allocator's next input (a request,
an ack, or a worker's tick on control.ticks every CLOCKTOWER_STREAMS_TICK_S) once the budget allows (while its
fault is within `max_fault_age_ns`); an operator's approval (a request signed with the control key,
control/approval.py: `clocktower control approve`) is granted whatever the budget and the age say.

A request for a fault older than `max_fault_age_ns` on the allocator's wall clock (the streams lagged, or the
report came late) orders nothing: the incident says so, and a human decides. Commands are valid from when they are
issued (control/issuer.py), so a lag below that age does not void them. While the node is being replaced, a
`drain` or `spare` that its node acks as expired or failed is ordered again (a new command id), at most
`MAX_REORDERS` times, if the ack is at most `REORDER_WITHIN_NS` old and the fault within its age limit (a lagging
allocator must not drain a node again after an undrain that it has yet to read); one refused for another reason is
not, and the incident says why. A `replayed` refusal (a copy of a command the node had handled) counts as the
status the node recorded for the newest order, whose first ack a crash may have lost, and is ignored for an older
one.

Acks come from the nodes: with CLOCKTOWER_PRODUCER_KEY set, the streams act only on acks signed by the node
they name (streams/topology.py), so a node can free only the spare that replaces it, and only on requests they
signed themselves in the faulty node's name (streams/node_signed_outputs.py); without it, anyone who can write
control.acks or control.replacements can. A spare's hook should still refuse a second activation. A
redelivered request is answered with the same outputs (same incident row, same command ids) without asking the
budget again: a grant is rebuilt from what the fleet entry keeps of it, and the newest `ANSWERED` withheld
answers are kept.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import orjson

from clocktower.control.approval import is_approved
from clocktower.control.intent import CommandIntent, command_id_of
from clocktower.control.signing import CommandVerifier
from clocktower.schemas.analytics import Incident
from clocktower.schemas.codec import bounded
from clocktower.schemas.control import ControlAck, ReplacementRequest
from clocktower.schemas.event import Event
from clocktower.schemas.ids import bounded_name
from clocktower.schemas.operations import StreamsTick
from clocktower.streams.detectors.delivery_log import Emitted, decode_output, encode_output
from clocktower.streams.processor import Output, Processor
from clocktower.streams.remediation_budget import RemediationBudget

if TYPE_CHECKING:
    from clocktower.streams.processor_context import ProcessorContext

log = logging.getLogger(__name__)
FLEET = "fleet"
ANSWERED = 32                      # newest withheld answers kept for redelivered requests
MAX_REORDERS = 5                   # a drain or spare acked expired or failed is ordered again at most this often
REORDER_WITHIN_NS = 60 * 10**9     # ... and only if its ack is this recent on the allocator's clock (a command's TTL)
DEFAULT_MAX_FAULT_AGE_NS = 15 * 60 * 10**9
RETURNED = 4096                    # nodes whose return to service (undrain) is remembered, newest first
STATE_TTL_NS = 365 * 24 * 3600 * 10**9   # the fleet's entry is rewritten by every request; never let it lapse


@dataclass
class Replacement:
    """A granted replacement: the spare it ordered ("" = none), and the request that was granted."""

    spare: str
    ts_ns: int
    incident_id: str
    reason: str = "gpu_lost"
    gpu: int = 0
    reorders: dict[str, list[int]] = field(default_factory=dict)   # action -> times of its orders after the first


@dataclass
class Fleet:
    granted: list[int] = field(default_factory=list)                    # the budget's grants (processing clock)
    replaced: dict[str, Replacement] = field(default_factory=dict)      # node being replaced -> its replacement
    answered: list[tuple[str, Emitted]] = field(default_factory=list)   # withheld requests: (incident id, outputs)
    returned: dict[str, int] = field(default_factory=dict)              # node -> its last undrain (ack ts_ns)
    withheld: list[ReplacementRequest] = field(default_factory=list)    # over budget: asked again, oldest first
    retries: list[tuple[str, Emitted]] = field(default_factory=list)    # input -> the withheld it let through
    held_back: list[ReplacementRequest] = field(default_factory=list)   # withheld or refused: what may be approved


def outcome_of(ack: ControlAck) -> str:
    """What became of the command: its ack's status, or for a `replayed` refusal (a copy of a command the node had
    handled, whose first ack may have been lost in a crash) the status the node recorded then."""
    if ack.status == "refused" and ack.detail.startswith("replayed"):
        found = re.search(r"status (\w+)\)", ack.detail)
        return found.group(1) if found else "replayed"
    return ack.status


def _hold_back(fleet: Fleet, req: ReplacementRequest) -> None:
    """Remember `req` (withheld or refused) as one an operator may approve (the newest ANSWERED)."""
    kept = [r for r in fleet.held_back if r.incident_id != req.incident_id]
    fleet.held_back = [*kept, req.model_copy(update={"approval": ""})][-ANSWERED:]


def _trigger_key(event: Event) -> str:
    """An input's identity, the same when it is redelivered."""
    if isinstance(event, ControlAck):
        return f"ack\0{event.command_id}\0{event.status}\0{event.ts_ns}"
    if isinstance(event, StreamsTick):
        return f"tick\0{event.node}\0{event.ts_ns}"
    assert isinstance(event, ReplacementRequest)
    return f"request\0{event.incident_id}" + ("\0approved" if event.approval else "")   # an approval: its own


class ReplacementAllocator(Processor):
    name: ClassVar[str] = "replacement_allocator"
    consumes: ClassVar[tuple[type[Event], ...]] = (ReplacementRequest, ControlAck, StreamsTick)
    key_by: ClassVar[str] = "fleet"

    def __init__(self, *, budget: RemediationBudget | None = None, spare_nodes: tuple[str, ...] = (),
                 max_fault_age_ns: int = DEFAULT_MAX_FAULT_AGE_NS, approval_verifier: CommandVerifier | None = None,
                 fleet_nodes: frozenset[str] = frozenset(), known_after_ns: int = 0) -> None:
        """`approval_verifier` checks operators' approvals (control/approval.py); without it none is believed.
        `fleet_nodes`, when not empty, are the only nodes a request may spend the budget on; a node not listed
        spends it only once its failing GPU has reported for `known_after_ns` (the request's `known_for_ns`)."""
        self.approval_verifier = approval_verifier
        self.fleet_nodes = fleet_nodes
        self.known_after_ns = known_after_ns
        self.budget = budget if budget is not None else RemediationBudget()
        self.spare_nodes = tuple(spare_nodes)
        self.max_fault_age_ns = max_fault_age_ns
        self.redelivered = 0
        self.spares_freed = 0
        self.reordered = 0
        self.retried = 0
        self.approved = 0
        self.approvals_refused = 0

    @classmethod
    def from_context(cls, ctx: ProcessorContext) -> ReplacementAllocator:
        return cls(budget=ctx.remediation_budget, spare_nodes=ctx.spare_nodes, max_fault_age_ns=ctx.max_fault_age_ns,
                   approval_verifier=ctx.approval_verifier, fleet_nodes=ctx.fleet_nodes,
                   known_after_ns=ctx.known_after_ns)

    def partition_key(self, event: Event) -> str:
        return FLEET

    def counters(self) -> dict[str, int]:
        return {"redelivered": self.redelivered, "spares_freed": self.spares_freed, "reordered": self.reordered,
                "retried": self.retried, "approved": self.approved, "approvals_refused": self.approvals_refused}

    def process(self, state: Any, event: Event) -> list[Output]:
        """The event's own outputs, and the withheld requests it lets through. A request lets the older withheld
        ones go first (oldest first); an ack is handled first (an undrain settles its node's withheld request)."""
        if isinstance(event, ControlAck):
            return self._process(state, event) + self._retry_withheld(state, event)
        if isinstance(event, StreamsTick):       # a worker's tick: only the withheld requests are asked again
            return self._retry_withheld(state, event)
        return self._retry_withheld(state, event) + self._process(state, event)

    def _process(self, state: Any, event: Event) -> list[Output]:
        if isinstance(event, ControlAck):
            if event.action == "undrain" and event.status == "applied":
                self._undrained(state, event)
            elif event.action in ("drain", "spare") and event.status in ("refused", "failed"):
                return self._not_applied(state, event)
            return []
        assert isinstance(event, ReplacementRequest)
        fleet: Fleet = state.get(FLEET) or Fleet()
        granted = fleet.replaced.get(event.node)
        if granted is not None and granted.incident_id == event.incident_id:
            self.redelivered += 1                    # the same grant, rebuilt: same row, same command ids
            return list(self._granted(event, granted.spare))
        if granted is not None:
            return [self._row(event, "the node is already being replaced" + (
                f" by {granted.spare}" if granted.spare else "") + ": no second drain or spare")]
        if event.approval:
            return self._approved(state, fleet, event)
        held = next((out for incident_id, out in fleet.answered if incident_id == event.incident_id), None)
        if held is not None:
            self.redelivered += 1
            return list(held)
        back = fleet.returned.get(event.node)
        if back is not None and event.ts_ns <= back:
            return [self._row(event, f"drain and spare not ordered: the fault is dated before the node returned to "
                                     f"service ({(back - event.ts_ns) / 1e9:.0f} s later, undrain acked): a "
                                     "replayed or stale request")]
        age_ns = self.budget.clock_ns() - event.ts_ns
        if self.fleet_nodes and event.node not in self.fleet_nodes:
            out = [self._row(event, "drain and spare not ordered: the node is not one of the fleet's "
                                    "(CLOCKTOWER_STREAMS_FLEET_NODES); no budget spent; `clocktower control approve` "
                                    "orders it if it is real")]
            fleet.answered = [*fleet.answered, (event.incident_id, out)][-ANSWERED:]
            _hold_back(fleet, event)
        elif event.node not in self.fleet_nodes and event.known_for_ns < self.known_after_ns:
            out = [self._row(event, f"drain and spare not ordered: the node's GPU had reported for "
                                    f"{event.known_for_ns / 1e9:.0f} s, less than the "
                                    f"{self.known_after_ns / 1e9:.0f} s that makes it known to the fleet "
                                    "(CLOCKTOWER_STREAMS_KNOWN_AFTER_S; or list it in CLOCKTOWER_STREAMS_FLEET_NODES); "
                                    "no budget spent; `clocktower control approve` orders it if it is real")]
            fleet.answered = [*fleet.answered, (event.incident_id, out)][-ANSWERED:]
            _hold_back(fleet, event)
        elif age_ns > self.max_fault_age_ns:
            out = [self._row(event, f"drain and spare not ordered: the fault was reported {age_ns / 1e9:.0f} s ago, "
                                    f"more than the {self.max_fault_age_ns / 1e9:.0f} s a replacement may still be "
                                    "ordered after (CLOCKTOWER_STREAMS_MAX_FAULT_AGE_S); it needs a human")]
            fleet.answered = [*fleet.answered, (event.incident_id, out)][-ANSWERED:]
            _hold_back(fleet, event)
        elif not self.budget.allow(fleet.granted):
            b = self.budget
            out: Emitted = [self._row(event, f"drain and spare withheld: the fleet limit of {b.max_per_window} "
                                             f"replacements per {b.window_ns / 1e9:g} s is reached; asked again when "
                                             "it allows, while the fault is recent enough, else it needs a human")]
            fleet.answered = [*fleet.answered, (event.incident_id, out)][-ANSWERED:]
            _hold_back(fleet, event)
            if all(w.incident_id != event.incident_id for w in fleet.withheld):
                fleet.withheld = [*fleet.withheld, event]
                for pushed in fleet.withheld[:-ANSWERED]:     # more than ANSWERED waiting: the oldest give up
                    out.append(self._dropped(fleet, pushed, state, f"withheld drain and spare not ordered: more than "
                                             f"{ANSWERED} requests were waiting for the budget; it needs a human"))
                fleet.withheld = fleet.withheld[-ANSWERED:]
        else:
            out = self._grant(fleet, event)
        state.put(FLEET, fleet, max(state.now_ns, event.ts_ns) + STATE_TTL_NS)
        return list(out)

    def _approved(self, state: Any, fleet: Fleet, req: ReplacementRequest) -> list[Output]:
        """An operator's approval (control/approval.py) of a request this allocator withheld or refused itself (the
        same node, fault time, reason and GPU): granted whatever the budget and the fault's age say (a human
        checked), counted in the budget's window, once. Anything else orders nothing and writes no row (a row would
        take the place of the incident's real one): a forged or altered approval, one of a request the allocator
        never held back (planted in the tables for an operator to approve), or one already granted."""
        plain = req.model_copy(update={"approval": ""})
        held = next((r for r in fleet.held_back if r.incident_id == req.incident_id), None)
        why = ("not signed by the control key (forged or altered)"
               if self.approval_verifier is None or not is_approved(self.approval_verifier, req)
               else "of a request this allocator did not hold back (or granted already)" if held != plain
               else "")
        if why:
            self.approvals_refused += 1
            n = self.approvals_refused
            if n & (n - 1) == 0:
                log.warning("%d approvals refused; the last, of %s's incident %s: %s", n, req.node,
                            bounded(req.incident_id, 100), why)
            return []
        fleet.held_back = [r for r in fleet.held_back if r.incident_id != req.incident_id]
        fleet.granted.append(self.budget.clock_ns())
        fleet.withheld = [w for w in fleet.withheld if w.incident_id != req.incident_id]
        fleet.answered = [(a, o) for a, o in fleet.answered if a != req.incident_id]
        self.approved += 1
        out = self._grant(fleet, req)
        state.put(FLEET, fleet, max(state.now_ns, req.ts_ns) + STATE_TTL_NS)
        return list(out)

    def _grant(self, fleet: Fleet, req: ReplacementRequest) -> Emitted:
        busy = {r.spare for r in fleet.replaced.values()} | set(fleet.replaced)   # in use, or being replaced
        spare = next((n for n in self.spare_nodes if n != req.node and n not in busy), "")
        fleet.replaced[req.node] = Replacement(spare, req.ts_ns, req.incident_id, req.reason, req.gpu)
        return self._granted(req, spare)

    def _retry_withheld(self, state: Any, trigger: Event) -> list[Output]:
        """Withheld requests, oldest first, at the allocator's next input (a request, any ack or a tick): granted
        while the budget allows; dropped, with a row saying so, once their fault is older than `max_fault_age_ns`,
        or when their node is being replaced or came back since. What an input let through is kept under its
        identity (newest `ANSWERED`): the same input redelivered after a crash gives the same outputs again, as the
        state that recorded them may have been written before they were sent."""
        fleet: Fleet | None = state.get(FLEET)
        if fleet is None:
            return []
        key = _trigger_key(trigger)
        again = next((out for k, out in fleet.retries if k == key), None)
        if again is not None:
            self.redelivered += 1
            return list(again)
        if not fleet.withheld:
            return []
        out: Emitted = []
        left: list[ReplacementRequest] = []
        for i, req in enumerate(fleet.withheld):
            if isinstance(trigger, ReplacementRequest) and req.incident_id == trigger.incident_id:
                left.append(req)                          # itself, redelivered: answered as withheld; next time
                continue
            age_ns = self.budget.clock_ns() - req.ts_ns
            back = fleet.returned.get(req.node)
            being = fleet.replaced.get(req.node)
            if being is not None or (back is not None and req.ts_ns <= back):
                why = (f"the node is being replaced since (incident {being.incident_id})" if being is not None
                       else "the node was returned to service since (undrain acked)")
                out.append(self._dropped(fleet, req, state, f"withheld drain and spare not ordered: {why}"))
            elif age_ns > self.max_fault_age_ns:
                out.append(self._dropped(fleet, req, state, f"withheld drain and spare not ordered: the fault is now "
                                         f"{age_ns / 1e9:.0f} s old, more than the {self.max_fault_age_ns / 1e9:.0f}"
                                         " s a replacement may still be ordered after; it needs a human"))
            elif self.budget.allow(fleet.granted, count_withheld=False):
                self.retried += 1
                fleet.answered = [(a, o) for a, o in fleet.answered if a != req.incident_id]
                out += self._grant(fleet, req)
            else:
                left += [r for r in fleet.withheld[i:] if r not in left]   # the budget is still spent: they wait
                break
        if len(left) == len(fleet.withheld):
            return []
        fleet.withheld = left
        if out:
            fleet.retries = [*fleet.retries, (key, out)][-ANSWERED:]
        state.put(FLEET, fleet, state.now_ns + STATE_TTL_NS)
        return list(out)

    def _dropped(self, fleet: Fleet, req: ReplacementRequest, state: Any, detail: str) -> Incident:
        """The row for a withheld request given up; a redelivered copy of the request gets this row too."""
        _hold_back(fleet, req)
        row = self._row_of(req.node, max(state.now_ns, req.ts_ns + 1), self._replacement_of(req), detail)
        fleet.answered = [*[(a, o) for a, o in fleet.answered if a != req.incident_id], (req.incident_id, [row])]
        fleet.answered = fleet.answered[-ANSWERED:]
        return row

    @staticmethod
    def _replacement_of(req: ReplacementRequest) -> Replacement:
        return Replacement("", req.ts_ns, req.incident_id, req.reason, req.gpu)

    def _undrained(self, state: Any, ack: ControlAck) -> None:
        """The replaced node is back: its spare is free. Only an undrain after the grant counts (the acks and
        the requests come on two topics, each replayed from its own commit after a crash)."""
        fleet: Fleet | None = state.get(FLEET)
        if fleet is None:
            return
        granted = fleet.replaced.get(ack.node)
        if granted is None:   # a node repaired while its request was withheld: that request orders nothing now
            if any(w.node == ack.node and w.ts_ns < ack.ts_ns for w in fleet.withheld):
                fleet.returned[ack.node] = max(ack.ts_ns, fleet.returned.get(ack.node, 0))
                state.put(FLEET, fleet, max(state.now_ns, ack.ts_ns) + STATE_TTL_NS)
            return
        if ack.ts_ns <= granted.ts_ns:
            return
        del fleet.replaced[ack.node]
        fleet.returned[ack.node] = ack.ts_ns
        if len(fleet.returned) > RETURNED:
            fleet.returned = dict(sorted(fleet.returned.items(), key=lambda kv: kv[1])[-RETURNED:])
        self.spares_freed += 1
        state.put(FLEET, fleet, max(state.now_ns, ack.ts_ns) + STATE_TTL_NS)

    def _not_applied(self, state: Any, ack: ControlAck) -> list[Output]:
        """A node acked a drain or spare of a replacement under way as refused or failed: order it again if it
        expired or failed (a new id), else say why in the incident. An ack of an older order of it (redelivered)
        gives again what that ack gave; acks of commands no replacement holds now change nothing."""
        fleet: Fleet | None = state.get(FLEET)
        if fleet is None:
            return []
        if ack.action == "drain":
            node, r = ack.node, fleet.replaced.get(ack.node)
        else:
            node, r = next(((n, g) for n, g in fleet.replaced.items() if g.spare and g.spare == ack.node), ("", None))
        if r is None:
            return []
        times = [r.ts_ns, *r.reorders.get(ack.action, [])]
        ids = [command_id_of(self._intent(ack.action, node, r, t)) for t in times]
        outcome = outcome_of(ack)
        now = self.budget.clock_ns()
        stale = now - ack.ts_ns > REORDER_WITHIN_NS or now - r.ts_ns > self.max_fault_age_ns
        if ack.command_id in ids[:-1]:
            if ack.detail.startswith("replayed"):   # a copy of an older order, refused: its own ack came before
                return []
            self.redelivered += 1                   # redelivered: the order it caused, again (the row only, if the
            out = self._reorder(node, r, outcome, ack, times, ids.index(ack.command_id) + 1)   # ack is old now:
            return out[:1] if stale else out        # that id went out, and a late copy would act late)
        if ack.command_id != ids[-1] or outcome in ("applied", "started"):
            return []
        retry = outcome == "failed" or ack.detail.startswith("expired")
        if not retry or stale or len(times) > MAX_REORDERS:
            why = ("not ordered again" if not retry else "too old to order again: it needs a human" if stale
                   else f"ordered {len(times)} times: not again, it needs a human")
            return [self._row_of(node, ack.ts_ns, r, f"{ack.action} {outcome} by {ack.node}: {ack.detail}; {why}")]
        t = max(min(ack.ts_ns, now), times[-1] + 1)   # a node's clock never dates it ahead
        r.reorders[ack.action] = [*times[1:], t]
        self.reordered += 1
        state.put(FLEET, fleet, max(state.now_ns, t) + STATE_TTL_NS)
        return self._reorder(node, r, outcome, ack, [*times, t], len(times))

    def _reorder(self, node: str, r: Replacement, outcome: str, ack: ControlAck, times: list[int],
                 i: int) -> list[Output]:
        intent = self._intent(ack.action, node, r, times[i])
        detail = f"{ack.action} {outcome} by {ack.node}: ordered again ({i} of {MAX_REORDERS})"
        return [self._row_of(node, times[i], r, detail, [command_id_of(intent)]), intent]

    @staticmethod
    def _intent(action: str, node: str, r: Replacement, ts_ns: int) -> CommandIntent:
        if action == "drain":
            return CommandIntent(node, "drain", node, ts_ns, r.incident_id, {"reason": r.reason, "gpu": str(r.gpu)})
        return CommandIntent(r.spare, "spare", r.spare, ts_ns, r.incident_id, {"replaces": node})

    def _granted(self, req: ReplacementRequest, spare: str) -> Emitted:
        """The outputs of a granted request, given its spare: built the same way again for a redelivery."""
        r = Replacement(spare, req.ts_ns, req.incident_id, req.reason, req.gpu)
        cmds = [self._intent("drain", req.node, r, req.ts_ns)]
        if spare:
            cmds.append(self._intent("spare", req.node, r, req.ts_ns))
            detail = f"drain ordered, spare {spare} ordered"
        elif self.spare_nodes:
            detail = (f"drain ordered; no free spare: the pool's {len(self.spare_nodes)} spares replace other "
                      "nodes or are being replaced (one is freed by `clocktower control undrain` of the node it "
                      "replaces)")
        else:
            detail = "drain ordered; no spare node configured (CLOCKTOWER_STREAMS_SPARE_NODES): no spare ordered"
        return [self._row(req, detail, [command_id_of(c) for c in cmds]), *cmds]

    @classmethod
    def _row(cls, req: ReplacementRequest, detail: str, command_ids: list[str] | None = None) -> Incident:
        r = Replacement("", req.ts_ns, req.incident_id, req.reason, req.gpu)
        return cls._row_of(req.node, req.ts_ns, r, detail, command_ids)

    @staticmethod
    def _row_of(node: str, ts_ns: int, r: Replacement, detail: str, command_ids: list[str] | None = None) -> Incident:
        return Incident(node=node, ts_ns=ts_ns, incident_id=r.incident_id, kind=r.reason, state="update",
                        severity="critical", target=bounded_name(f"{node}/gpu{r.gpu}"), opened_ns=r.ts_ns,
                        detail=bounded(detail, 4000), command_ids=command_ids or [])

    def encode_state(self, value: Fleet) -> bytes:
        return orjson.dumps({"granted": value.granted,
                             "replaced": {n: [r.spare, r.ts_ns, r.incident_id, r.reason, r.gpu, r.reorders]
                                          for n, r in value.replaced.items()},
                             "answered": [[i, [encode_output(o) for o in out]] for i, out in value.answered],
                             "returned": value.returned,
                             "withheld": [[r.node, r.ts_ns, r.incident_id, r.reason, r.gpu] for r in value.withheld],
                             "retries": [[k, [encode_output(o) for o in out]] for k, out in value.retries],
                             "held_back": [[r.node, r.ts_ns, r.incident_id, r.reason, r.gpu] for r in value.held_back]})

    def decode_state(self, data: bytes) -> Fleet:
        d = orjson.loads(data)
        return Fleet(d["granted"], {n: Replacement(*r) for n, r in d["replaced"].items()},
                     [(i, [decode_output(o) for o in out]) for i, out in d["answered"]],
                     d.get("returned", {}),   # (a state written before it was kept has none)
                     [ReplacementRequest(node=n, ts_ns=t, incident_id=i, reason=r, gpu=g)
                      for n, t, i, r, g in d.get("withheld", [])],
                     [(k, [decode_output(o) for o in out]) for k, out in d.get("retries", [])],
                     [ReplacementRequest(node=n, ts_ns=t, incident_id=i, reason=r, gpu=g)
                      for n, t, i, r, g in d.get("held_back", [])])
