"""The fleet's replacement allocator: one budget and one set of spares for the whole fleet, kept in its table.

Before it, each GPU detector (per node, per worker) picked a spare by a hash of the node's name and held its
own budget: two nodes failing together could be sent the same spare, and N workers allowed N times the limit.
"""

from __future__ import annotations

from collections.abc import MutableMapping

from clocktower.control.intent import CommandIntent, command_id_of
from clocktower.schemas.analytics import Incident
from clocktower.schemas.control import ControlAck, ControlCommand, ReplacementRequest
from clocktower.schemas.operations import StreamsTick
from clocktower.schemas.telemetry import GpuHealth
from clocktower.streams.detectors.replacement_allocator import ANSWERED, MAX_REORDERS, ReplacementAllocator
from clocktower.streams.processor_runner import ProcessorRunner
from clocktower.streams.processors import Processors
from clocktower.streams.registry import BY_MODEL, partitions, repartitions
from clocktower.streams.remediation_budget import HOUR_NS, RemediationBudget
from clocktower.streams.state_store import StateStore
from tests.control_keys import TEST_SIGNER
from tests.test_detectors import GPU_READINGS, worker

T0 = 1_780_000_000 * 10**9
S = 10**9
POOL = ("spare-1", "spare-2")


class Clock:
    def __init__(self, now: int = 1_000 * S) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def request(node: str, i: int = 0, gpu: int = 0) -> ReplacementRequest:
    return ReplacementRequest(node=node, ts_ns=T0 + i * S, incident_id=f"inc-{node}-{gpu}-{i}", reason="gpu_lost",
                              gpu=gpu)


def undrain_ack(node: str, status: str = "applied", action: str = "undrain") -> ControlAck:
    return ControlAck(node=node, ts_ns=T0 + 100 * S, command_id="c-1", status=status, action=action, target=node)


class Allocator:
    """The allocator over a table, one event per batch (every state write goes through the codec)."""

    def __init__(self, backing: MutableMapping[bytes, bytes] | None = None, max_per_hour: int = 100,
                 spares: tuple[str, ...] = POOL, clock: Clock | None = None) -> None:
        self.budget = RemediationBudget(max_per_hour, clock_ns=clock or Clock())
        self.proc = ReplacementAllocator(budget=self.budget, spare_nodes=spares)
        self.store = StateStore(self.proc, {} if backing is None else backing)
        self.store.reload()

    def __call__(self, event: ReplacementRequest | ControlAck | StreamsTick) -> list:
        out = self.proc.process(self.store, event)
        self.store.flush()
        return out


def spares_of(out: list) -> list[str]:
    return [c.node for c in out if isinstance(c, CommandIntent) and c.action == "spare"]


def test_it_reads_every_request_and_ack_under_one_key_on_one_partition() -> None:
    assert {BY_MODEL[m].partitions for m in ReplacementAllocator.consumes} == {1}
    assert partitions(ReplacementAllocator) == 1 and not repartitions(ReplacementAllocator)
    assert ReplacementAllocator().partition_key(request("node-1")) == "fleet"


def test_two_nodes_failing_together_get_different_spares_and_a_third_is_told_none_is_free() -> None:
    alloc = Allocator()
    one, two, three = alloc(request("node-1")), alloc(request("node-2")), alloc(request("node-3"))
    assert spares_of(one) == ["spare-1"] and spares_of(two) == ["spare-2"] and spares_of(three) == []
    row, drain, spare = one
    assert isinstance(row, Incident) and (row.incident_id, row.state, row.kind) == ("inc-node-1-0-0", "update",
                                                                                    "gpu_lost")
    assert (drain.node, drain.action, drain.target, drain.params) == ("node-1", "drain", "node-1",
                                                                      {"reason": "gpu_lost", "gpu": "0"})
    assert (spare.node, spare.target, spare.params) == ("spare-1", "spare-1", {"replaces": "node-1"})
    assert row.command_ids == [command_id_of(drain), command_id_of(spare)]
    assert [c.action for c in three if isinstance(c, CommandIntent)] == ["drain"]
    assert "no free spare" in three[0].detail


def test_a_spare_is_never_the_faulty_node_itself() -> None:
    assert spares_of(Allocator(spares=("node-1", "spare-1"))(request("node-1"))) == ["spare-1"]


def test_with_no_spare_pool_the_node_drains_and_the_incident_says_no_spare() -> None:
    out = Allocator(spares=())(request("node-1"))
    assert [c.action for c in out if isinstance(c, CommandIntent)] == ["drain"]
    assert "no spare node configured" in out[0].detail and out[0].command_ids == [command_id_of(out[1])]


def test_a_second_gpu_of_a_node_being_replaced_drains_nothing_more() -> None:
    alloc = Allocator(max_per_hour=2)
    alloc(request("node-1", gpu=0))
    (row,) = alloc(request("node-1", 1, gpu=3))
    assert "already being replaced by spare-1" in row.detail and row.command_ids == []
    assert spares_of(alloc(request("node-2"))) == ["spare-2"]         # and it used none of the budget


def test_the_budget_is_the_fleets_and_holds_across_a_restart() -> None:
    table: dict[bytes, bytes] = {}
    clock = Clock()
    assert spares_of(Allocator(table, max_per_hour=1, clock=clock)(request("node-1"))) == ["spare-1"]
    restarted = Allocator(table, max_per_hour=1, clock=clock)       # another worker took the partition over
    (held,) = restarted(request("node-2"))
    assert "withheld: the fleet limit" in held.detail and held.command_ids == []
    assert restarted.budget.withheld == 1
    clock.now += HOUR_NS                                             # the hour has passed: node-2, withheld, first
    out = restarted(request("node-3", 2))
    assert spares_of(out) == ["spare-2"] and [c.node for c in intents(out) if c.action == "drain"] == ["node-2"]
    assert "withheld: the fleet limit" in out[-1].detail and out[-1].node == "node-3"


def test_a_withheld_request_is_granted_at_the_next_input_once_the_budget_allows() -> None:
    """Issue 18 finding 3: a real node's lost GPU got "withheld, needs human approval", and nothing asked again."""
    clock = Clock(T0)
    table: dict[bytes, bytes] = {}
    alloc = Allocator(table, max_per_hour=1, clock=clock)
    alloc(request("node-1"))
    (held,) = alloc(request("node-2", 1))
    assert held.command_ids == [] and alloc.budget.withheld == 1
    clock.now += 10 * 60 * S
    assert alloc(undrain_ack("node-9", status="refused")) == []    # an unrelated ack: the hour is not over yet
    clock.now = T0 + HOUR_NS + S                                    # (past the 15 min age limit too: dropped)
    (dropped,) = Allocator(table, max_per_hour=1, clock=clock)(undrain_ack("node-9", status="refused"))
    assert "withheld drain and spare not ordered: the fault is now" in dropped.detail and not dropped.command_ids
    # within the age limit: the next input after the window frees grants it, with the ids a grant would have
    clock.now = T0
    alloc = Allocator({}, max_per_hour=1, clock=clock)
    alloc(request("node-1"))
    alloc(request("node-2", 1))
    alloc(request("node-3", 2))                                     # two withheld, in order
    clock.now = T0 + 10 * 60 * S
    alloc.budget.window_ns = 5 * 60 * S                             # (a 5 min window: node-1's grant has left it)
    out = alloc(undrain_ack("node-9", status="refused"))
    row, drain, spare = out
    assert (drain.node, drain.action, spare.node) == ("node-2", "drain", "spare-2") and alloc.proc.retried == 1
    assert row.command_ids == [command_id_of(drain), command_id_of(spare)]
    assert alloc.budget.withheld == 2                                # counted once each, not again per retry
    assert alloc(request("node-2", 1)) == out                        # redelivered: the same grant
    fleet = alloc.store.get("fleet")
    assert [r.node for r in fleet.withheld] == ["node-3"]            # still waiting for the budget


def test_a_workers_tick_grants_a_withheld_request_or_gives_it_up_when_no_other_input_comes() -> None:
    """Issue 18 finding 3: the retry waited for the next request or ack, which a quiet fleet may never send. Each
    stream worker's tick (control.ticks) is such an input; it asks for nothing itself, and a copy asks nothing."""
    clock = Clock(T0)
    alloc = Allocator({}, max_per_hour=1, clock=clock)
    alloc(request("node-1"))
    alloc(request("node-2", 1))
    assert alloc(tick(1)) == []                                      # the budget is still spent: it waits
    clock.now = T0 + 10 * 60 * S
    alloc.budget.window_ns = 5 * 60 * S
    row, drain, spare = alloc(tick(2))
    assert (drain.node, spare.node, alloc.proc.retried) == ("node-2", "spare-2", 1)
    assert row.command_ids == [command_id_of(drain), command_id_of(spare)]
    assert alloc(tick(2)) == [row, drain, spare] and alloc(tick(3)) == []   # redelivered: the same; a new one: none
    # no budget until the fault is too old: the tick gives it up, and the incident says a human must decide
    clock.now = T0
    alloc = Allocator({}, max_per_hour=1, clock=clock)
    alloc(request("node-1"))
    alloc(request("node-2", 1))
    clock.now = T0 + 20 * 60 * S
    (dropped,) = alloc(tick(4))
    assert "the fault is now" in dropped.detail and "needs a human" in dropped.detail and not dropped.command_ids
    assert alloc.store.get("fleet").withheld == []


def tick(i: int) -> StreamsTick:
    return StreamsTick(node="ct-streams-host-a", ts_ns=T0 + i * S)


def test_an_applied_undrain_of_the_replaced_node_frees_its_spare() -> None:
    alloc = Allocator(spares=("spare-1",))
    alloc(request("node-1"))
    assert spares_of(alloc(request("node-2"))) == []
    for not_a_release in (undrain_ack("node-1", status="refused"), undrain_ack("node-1", action="drain"),
                          undrain_ack("node-9")):
        assert alloc(not_a_release) == []
    assert spares_of(alloc(request("node-3"))) == []
    assert alloc(undrain_ack("node-1")) == [] and alloc.proc.spares_freed == 1
    assert spares_of(alloc(request("node-4"))) == ["spare-1"]
    (again,) = alloc(request("node-4", 1, gpu=1))
    assert "already being replaced by spare-1" in again.detail


def test_a_request_replayed_after_the_repair_orders_nothing_and_spends_no_budget() -> None:
    """Issue 18: a captured signed request replayed after the undrain was granted again, spent budget, and the
    node's next real fault got "already being replaced"."""
    table: dict[bytes, bytes] = {}
    alloc = Allocator(table, max_per_hour=2, spares=("spare-1",))
    genuine = request("node-1")
    assert spares_of(alloc(genuine)) == ["spare-1"]
    alloc(undrain_ack("node-1"))                                    # repaired, back in service at T0 + 100 s
    restarted = Allocator(table, max_per_hour=2, spares=("spare-1",))   # (kept in the table)
    (row,) = restarted(genuine)
    assert "dated before the node returned to service" in row.detail and row.command_ids == []
    assert len(restarted.store.get("fleet").granted) == 1           # no budget spent
    real = request("node-1", 200, gpu=2)                            # a new fault, after the repair
    assert spares_of(restarted(real)) == ["spare-1"]


def test_a_redelivered_request_gets_the_same_answer_without_asking_the_budget_again() -> None:
    table: dict[bytes, bytes] = {}
    first = Allocator(table, max_per_hour=1)(request("node-1"))
    restarted = Allocator(table, max_per_hour=1)
    assert restarted(request("node-1")) == first and restarted.proc.redelivered == 1
    assert restarted.budget.withheld == 0


def test_a_held_request_redelivered_after_the_hour_stays_held_and_only_the_newest_held_are_kept() -> None:
    clock = Clock()
    alloc = Allocator(max_per_hour=0, clock=clock)
    held = [alloc(request(f"node-{i}")) for i in range(ANSWERED + 5)]
    fleet = alloc.store.get("fleet")
    assert [r.node for r in fleet.withheld] == [f"node-{i}" for i in range(5, ANSWERED + 5)]   # the newest wait
    for i in range(5):                      # the oldest were pushed out of the queue, each with a row saying so
        pushed = held[ANSWERED + i][1]
        assert pushed.node == f"node-{i}" and "more than 32 requests were waiting" in pushed.detail
    kept = [incident_id for incident_id, _ in fleet.answered]
    assert len(kept) == ANSWERED and f"inc-node-{ANSWERED + 4}-0-0" in kept
    clock.now += 2 * HOUR_NS
    assert alloc(request(f"node-{ANSWERED + 4}")) == held[-1] and alloc.budget.withheld == ANSWERED + 5


def test_a_grant_redelivered_after_many_other_requests_is_the_same_grant() -> None:
    """Grants are rebuilt from the fleet entry, not from a bounded cache: no later row can overwrite the one
    that names the commands (same incident id, state and time)."""
    alloc = Allocator(max_per_hour=1000)
    first = alloc(request("node-1"))
    for i in range(ANSWERED + 5):
        alloc(request("node-1", i + 1, gpu=i % 8))
        alloc(request(f"node-{i + 2}"))
    assert alloc(request("node-1")) == first


def test_a_pool_node_being_replaced_is_never_given_as_a_spare() -> None:
    alloc = Allocator(spares=("spare-1", "spare-2"))
    assert spares_of(alloc(request("spare-1"))) == ["spare-2"]        # a spare lost a GPU: drained, replaced
    assert spares_of(alloc(request("node-1"))) == []                  # spare-1 is broken, spare-2 in use


def test_an_undrain_older_than_the_grant_frees_nothing() -> None:
    """Acks and requests come on two topics, each replayed from its own commit: an undrain of an earlier
    replacement of the node, read after the newer grant, must not free the newer spare."""
    alloc = Allocator(spares=("spare-1",))
    alloc(request("node-1", 200))                                      # granted at T0 + 200 s
    assert alloc(undrain_ack("node-1")) == [] and alloc.proc.spares_freed == 0   # the ack is dated T0 + 100 s
    assert spares_of(alloc(request("node-2", 201))) == []


def test_through_the_pipeline_two_lost_gpus_become_signed_drains_and_different_spares() -> None:
    """The GPU detector's requests feed the allocator (the in-memory pipeline: one worker, every partition)."""
    pipeline = Processors(TEST_SIGNER, clock_ns=lambda: T0 + S)
    pipeline.replace(ReplacementAllocator(budget=pipeline.budget, spare_nodes=POOL))
    lost = [GpuHealth(node=n, ts_ns=T0 + S, gpu=1, uuid="GPU-x", **{**GPU_READINGS, "lost": True})
            for n in ("node-1", "node-2")]
    out = pipeline.on_batch(lost)
    commands = [(c.node, c.action, c.params.get("replaces", "")) for c in out if isinstance(c, ControlCommand)]
    assert sorted(commands) == [("node-1", "drain", ""), ("node-2", "drain", ""),
                                ("spare-1", "spare", "node-1"), ("spare-2", "spare", "node-2")]
    rows = [r for r in out if isinstance(r, Incident) and r.state == "update"]
    assert len(rows) == 2 and all(len(r.command_ids) == 2 for r in rows)


def test_a_kill_after_the_state_write_replays_to_the_same_signed_commands() -> None:
    table: dict[bytes, bytes] = {}
    budget = RemediationBudget(clock_ns=lambda: T0)
    runner: ProcessorRunner = worker(ReplacementAllocator(spare_nodes=POOL, budget=budget), table)
    first = runner.run(0, [request("node-1")])
    again = worker(ReplacementAllocator(spare_nodes=POOL, budget=budget), table).run(0, [request("node-1")])
    assert again == first and [c.action for c in first if isinstance(c, ControlCommand)] == ["drain", "spare"]


def ack_of(cmd: CommandIntent, status: str, detail: str, at_s: int) -> ControlAck:
    """The node's ack of `cmd`, `at_s` seconds after T0."""
    return ControlAck(node=cmd.node, ts_ns=T0 + at_s * S, command_id=command_id_of(cmd), status=status,
                      detail=detail, action=cmd.action, target=cmd.target)


def intents(out: list) -> list[CommandIntent]:
    return [c for c in out if isinstance(c, CommandIntent)]


def test_a_fault_older_than_the_limit_orders_nothing_and_the_incident_says_so() -> None:
    """The streams were 20 minutes behind: a drain now would act on a fault nobody has checked since."""
    clock = Clock(T0 + 20 * 60 * S)
    alloc = Allocator(clock=clock)
    (row,) = alloc(request("node-1"))
    assert "the fault was reported 1200 s ago, more than the 900 s" in row.detail and row.command_ids == []
    assert alloc.budget.withheld == 0 and alloc(request("node-1")) == [row]      # redelivered: the same answer
    clock.now = T0 + 90 * S                                                      # 90 s late is within the limit
    assert [c.action for c in intents(alloc(request("node-2")))] == ["drain", "spare"]


def test_a_drain_acked_expired_or_failed_is_ordered_again_with_a_new_id() -> None:
    alloc = Allocator(clock=Clock(T0 + 5 * S))
    drain, spare = intents(alloc(request("node-1")))
    row, again = alloc(ack_of(drain, "refused", "expired 3.600 s ago", 70))
    assert (again.node, again.action, again.params) == (drain.node, "drain", drain.params)
    assert command_id_of(again) != command_id_of(drain) and again.ts_ns == T0 + 5 * S   # not after the clock
    assert "drain refused by node-1: ordered again (1 of" in row.detail and row.command_ids == [command_id_of(again)]
    _, third = alloc(ack_of(again, "failed", "drain hook exited 1", 71))
    assert command_id_of(third) not in (command_id_of(drain), command_id_of(again))
    _, spare_again = alloc(ack_of(spare, "refused", "expired 1.000 s ago", 72))
    assert (spare_again.node, spare_again.params) == ("spare-1", {"replaces": "node-1"})
    assert alloc.proc.reordered == 3


def test_a_redelivered_ack_gives_the_same_order_and_an_ack_of_a_superseded_order_nothing() -> None:
    table: dict[bytes, bytes] = {}
    alloc = Allocator(table, clock=Clock(T0 + 5 * S))
    drain, _ = intents(alloc(request("node-1")))
    expired = ack_of(drain, "refused", "expired 1.000 s ago", 70)
    first = alloc(expired)
    restarted = Allocator(table, clock=Clock(T0 + 9 * S))             # a worker replays the ack after a crash
    assert restarted(expired) == first and restarted.proc.reordered == 0
    assert restarted(ack_of(drain, "applied", "", 71)) == []          # applied: nothing to do


def test_a_drain_refused_for_another_reason_is_not_ordered_again_and_the_incident_says_why() -> None:
    alloc = Allocator(clock=Clock(T0 + 5 * S))
    drain, _ = intents(alloc(request("node-1")))
    (row,) = alloc(ack_of(drain, "refused", "no drain hook configured on this node", 70))
    assert "drain refused by node-1: no drain hook configured on this node; not ordered again" in row.detail
    assert row.command_ids == []


def test_re_orders_stop_after_the_limit_and_after_the_undrain() -> None:
    alloc = Allocator(clock=Clock(T0 + 5 * S))
    cmd, _ = intents(alloc(request("node-1")))
    for i in range(MAX_REORDERS):
        _, cmd = alloc(ack_of(cmd, "failed", "drain hook timed out", 70 + i))
    (row,) = alloc(ack_of(cmd, "failed", "drain hook timed out", 99))
    assert f"ordered {MAX_REORDERS + 1} times: not again, it needs a human" in row.detail
    alloc2 = Allocator(clock=Clock(T0 + 5 * S))
    drain, _ = intents(alloc2(request("node-1")))
    alloc2(undrain_ack("node-1"))                                      # repaired: the replacement is over
    assert alloc2(ack_of(drain, "refused", "expired 1.000 s ago", 120)) == []


def test_a_late_ack_or_an_old_fault_is_not_ordered_again_and_a_replay_refusal_is_ignored() -> None:
    """A lagging allocator reading an expired drain's ack long after it was sent may not have read the undrain the
    operator ran since: ordering the drain again would drain a repaired node."""
    clock = Clock(T0 + 5 * S)
    alloc = Allocator(clock=clock)
    drain, _ = intents(alloc(request("node-1")))
    clock.now = T0 + 200 * S
    (row,) = alloc(ack_of(drain, "refused", "expired 3.000 s ago", 70))            # read 130 s after it was sent
    assert "too old to order again: it needs a human" in row.detail and row.command_ids == []
    assert alloc(ack_of(drain, "refused", "replayed (first handled at ..., status applied)", 199)) == []
    clock2 = Clock(T0 + 5 * S)
    alloc2 = Allocator(clock=clock2)
    drain2, _ = intents(alloc2(request("node-2")))
    clock2.now = T0 + 16 * 60 * S                                                  # the fault is 16 min old
    (row2,) = alloc2(ack_of(drain2, "refused", "expired 1.000 s ago", 16 * 60 - 10))
    assert "too old to order again" in row2.detail


def test_a_replayed_refusal_counts_as_what_the_node_recorded_and_only_for_the_newest_order() -> None:
    """A node that crashed after recording a command's outcome, before acking it, answers the redelivered copy with
    `refused: replayed (... status X)`: that may be the only ack. A replayed copy of an older order was acked
    before, and must not order the next one again (it would go out with a fresh expiry, however late)."""
    clock = Clock(T0 + 5 * S)
    alloc = Allocator(clock=clock)
    drain, _ = intents(alloc(request("node-1")))
    _, again = alloc(ack_of(drain, "refused", "replayed (first handled at 2026-12-04T16:33:48.915+00:00, "
                                              "status failed)", 70))
    assert command_id_of(again) != command_id_of(drain) and alloc.proc.reordered == 1
    assert alloc(ack_of(again, "refused", "replayed (first handled at ..., status applied)", 71)) == []
    assert alloc(ack_of(drain, "refused", "replayed (first handled at ..., status failed)", 72)) == []
    clock.now = T0 + 300 * S                     # a redelivered ack, read long after: the row again, no command
    (row,) = alloc(ack_of(drain, "failed", "drain hook exited 1", 70))
    assert row.command_ids == [command_id_of(again)] and "ordered again (1 of" in row.detail


def test_what_an_input_let_through_is_given_again_when_that_input_is_redelivered() -> None:
    """The state that records a retried grant can be written before its commands are sent (a crash between): the
    input that let it through, read again, gives the same commands again, not nothing."""
    clock = Clock(T0)
    table: dict[bytes, bytes] = {}
    alloc = Allocator(table, max_per_hour=1, clock=clock)
    alloc(request("node-1"))
    alloc(request("node-2", 1))
    clock.now = T0 + 10 * 60 * S
    alloc.budget.window_ns = 5 * 60 * S
    trigger = undrain_ack("node-9", status="refused")
    first = alloc(trigger)
    assert [c.node for c in intents(first) if c.action == "drain"] == ["node-2"]
    restarted = Allocator(table, max_per_hour=1, clock=clock)       # crashed after the state write
    restarted.budget.window_ns = 5 * 60 * S
    assert restarted(trigger) == first and restarted.proc.retried == 0


def test_an_undrain_of_a_node_whose_request_is_withheld_settles_it_without_a_drain() -> None:
    """A human repaired the node while its request waited: the undrain must not be what lets the old request
    through (the retry ran before the ack was handled, and an undrain of a node not being replaced was ignored)."""
    clock = Clock(T0)
    alloc = Allocator(max_per_hour=1, clock=clock)
    alloc(request("node-1"))
    alloc(request("node-2", 1))
    clock.now = T0 + 10 * 60 * S
    alloc.budget.window_ns = 5 * 60 * S
    (row,) = alloc(undrain_ack("node-2"))                           # dated T0 + 100 s, after the fault
    assert "returned to service since" in row.detail and row.command_ids == []
    assert intents(alloc(request("node-2", 1))) == [] and alloc.store.get("fleet").withheld == []


def test_an_operators_approval_signed_with_the_control_key_orders_a_withheld_replacement() -> None:
    """Issue 18 finding 3: "withheld, needs human approval", and no command existed to approve it. Only the control
    key approves, only a request this allocator held back itself, and only once; a refused approval writes no row
    (it would take the place of the incident's real one) and is counted."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from clocktower.control.approval import approve
    from clocktower.control.signing import CommandSigner

    clock = Clock(T0)
    alloc = Allocator(max_per_hour=0, clock=clock)
    alloc.proc.approval_verifier = TEST_SIGNER.verifier()
    withheld = request("node-1")
    (held,) = alloc(withheld)
    assert "withheld" in held.detail
    forged = approve(CommandSigner(Ed25519PrivateKey.generate()), withheld)     # another key: a node's, a forger's
    altered = approve(TEST_SIGNER, withheld).model_copy(update={"gpu": 5})
    planted = approve(TEST_SIGNER, request("node-7"))                 # the allocator never saw it: an operator was
    genuine = approve(TEST_SIGNER, withheld)                          # fooled by a row planted in the tables
    b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    last = b64[b64.index(genuine.approval[-1]) ^ 1]                  # a spare bit: the same signature, spelled anew
    respelled = genuine.model_copy(update={"approval": genuine.approval[:-1] + last})
    import base64
    assert base64.urlsafe_b64decode(respelled.approval + "==") == base64.urlsafe_b64decode(genuine.approval + "==")
    for bad in (forged, altered, planted, respelled):
        assert alloc(bad) == [], bad
    assert alloc.proc.approvals_refused == 4 and alloc.store.get("fleet").granted == []
    clock.now = T0 + 20 * 60 * S                                    # older than the age limit: a human checked it
    out = alloc(genuine)
    assert [(c.node, c.action) for c in intents(out)] == [("node-1", "drain"), ("spare-1", "spare")]
    assert alloc.proc.approved == 1 and len(alloc.store.get("fleet").granted) == 1   # counted in the window
    assert alloc(genuine) == out                                    # redelivered: the same grant
    fleet = alloc.store.get("fleet")
    assert fleet.withheld == [] and fleet.held_back == []
    alloc(undrain_ack("node-1"))                                    # repaired and back: the approval replayed now
    assert alloc(genuine) == [] and alloc.proc.approved == 1        # orders nothing (it was used)


def test_with_a_fleet_list_an_invented_node_spends_no_budget() -> None:
    """Issue 18 finding 3: XID 79s from two invented node names used the budget of 2 per hour, and a real node's
    lost GPU was then withheld. With CLOCKTOWER_STREAMS_FLEET_NODES set, only listed nodes spend it."""
    from clocktower.streams.processor_context import context_from_settings
    from clocktower.streams.settings import StreamsSettings

    settings = StreamsSettings(streams_fleet_nodes="node-1, node-2", control_private_key_file=None)
    assert context_from_settings(settings).fleet_nodes == frozenset({"node-1", "node-2"})
    alloc = Allocator(max_per_hour=1, clock=Clock(T0))
    alloc.proc.fleet_nodes = frozenset({"node-1", "node-2"})
    for ghost in ("ghost-1", "ghost-2"):
        (row,) = alloc(request(ghost))
        assert "not one of the fleet's" in row.detail and row.command_ids == []
    assert alloc.store.get("fleet").granted == [] and alloc.budget.withheld == 0
    assert [c.action for c in intents(alloc(request("node-2")))] == ["drain", "spare"]
