"""The link-flap and GPU-fault detectors on the processor contract: behaviour, state codec, redelivery."""

from __future__ import annotations

from collections.abc import MutableMapping, Sequence

import orjson

from clocktower.control.intent import CommandIntent, command_id_of
from clocktower.control.issuer import CommandIssuer
from clocktower.schemas.analytics import Incident
from clocktower.schemas.control import ReplacementRequest
from clocktower.schemas.event import Event
from clocktower.schemas.telemetry import GpuHealth, LinkState
from clocktower.streams.detectors.delivery_log import STALE_NS
from clocktower.streams.detectors.gpu_fault import GpuFaultDetector
from clocktower.streams.detectors.link_flap import LinkFlapDetector
from clocktower.streams.detectors.replacement_allocator import ReplacementAllocator
from clocktower.streams.processor import Processor
from clocktower.streams.processor_context import ProcessorContext
from clocktower.streams.processor_runner import ProcessorRunner
from clocktower.streams.remediation_budget import RemediationBudget
from clocktower.streams.state_store import StateStore
from tests.control_keys import TEST_SIGNER
from tests.event_samples import GPU_READINGS

T0 = 1_780_000_000 * 10**9
S = 10**9
HOUR = 3600 * S


class Fed:
    """A detector fed one event per batch, so every event's state goes through the codec (flush, decode)."""

    def __init__(self, proc: Processor) -> None:
        self.proc, self.store = proc, StateStore(proc)

    def __call__(self, e: Event) -> list:
        out = self.proc.process(self.store, e)
        self.store.flush()
        return out


def worker(proc: Processor, backing: MutableMapping[bytes, bytes] | None = None) -> ProcessorRunner:
    """A worker that (re)starts over the table `backing`, as after a restart or a rebalance."""
    store = StateStore(proc, backing)
    store.reload()
    return ProcessorRunner(proc, store, CommandIssuer(TEST_SIGNER, clock_ns=lambda: 0))   # expiry: event time + ttl


def one_by_one(runner: ProcessorRunner, events: Sequence[Event]) -> list[list[Event]]:
    return [runner.run(0, [e]) for e in events]


def link(ts: int, up: bool, changes: int, iface: str = "eth0", node: str = "node-1",
         backup: str | None = None) -> LinkState:
    """A report of `iface`; eth0's backup is eth1 unless `backup` says otherwise."""
    backup = ("eth1" if iface == "eth0" else "") if backup is None else backup
    return LinkState(node=node, ts_ns=ts, interface=iface, kind="ethernet", up=up, carrier_changes=changes,
                     speed_mbps=0, operstate="up" if up else "down", carrier=up, backup=backup)


def gpu(ts: int, node: str = "node-3", index: int = 5, **kw) -> GpuHealth:
    return GpuHealth(node=node, ts_ns=ts, gpu=index, uuid="GPU-x", **{**GPU_READINGS, **kw})


def flap_and_recover(node: str = "node-1") -> list[LinkState]:
    """With the defaults: the 1 s down from T0+1 s opens a link_down incident at the T0+2 s report (failover),
    the third change at T0+3 s updates it to a flap, and T0+14 s, 10 s after the last change, resolves it
    (restore)."""
    return [link(T0, True, 0, node=node), link(T0 + S, False, 1, node=node), link(T0 + 2 * S, True, 2, node=node),
            link(T0 + 3 * S, False, 3, node=node), link(T0 + 4 * S, True, 4, node=node),
            link(T0 + 8 * S, True, 4, node=node), link(T0 + 14 * S, True, 4, node=node),
            link(T0 + 15 * S, True, 4, node=node)]


def hot_cool_hot() -> list[GpuHealth]:
    """Thermal throttling from 1 s, open (sustained) at 1.5 s, resolved after two cool readings at 2 and 2.5 s;
    throttled again from 3 s, open at 3.5 s; XID 79 and an ECC rise at 4 s (four emissions: a replay re-emits the
    newest EMITTED)."""
    hot = {"throttle_reasons": 0x40, "temperature_c": None}   # unknown: no early warning, the throttle decides
    return [gpu(T0), gpu(T0 + S, **hot), gpu(T0 + 3 * S // 2, **hot), gpu(T0 + 2 * S), gpu(T0 + 5 * S // 2),
            gpu(T0 + 3 * S, **hot), gpu(T0 + 7 * S // 2, **hot), gpu(T0 + 4 * S, xid=79, ecc_uncorrected=1, **hot)]


def test_built_from_the_workers_context() -> None:
    """The allocator shares the worker's one remediation budget; the detectors keep the node key."""
    budget = RemediationBudget(max_per_window=5)
    gpus = GpuFaultDetector.from_context(ProcessorContext(remediation_budget=budget))
    links = LinkFlapDetector.from_context(ProcessorContext())
    allocator = ReplacementAllocator.from_context(ProcessorContext(remediation_budget=budget, spare_nodes=("s",)))
    assert allocator.budget is budget and allocator.spare_nodes == ("s",) and isinstance(links, LinkFlapDetector)
    assert [(d.name, d.consumes, d.key_by) for d in (links, gpus)] == [
        ("link_flap", (LinkState,), "node"), ("gpu_fault", (GpuHealth,), "node")]
    assert (links.state_ttl_ns, gpus.state_ttl_ns) == (24 * HOUR, 24 * HOUR)
    assert (links.watchdog_ns, links.stable_ns, links.quarantine_flaps) == (50 * 10**6, 10 * S, 8)
    tuned = ProcessorContext(link_watchdog_ns=0, link_stable_ns=3 * S, link_quarantine_flaps=2)
    links = LinkFlapDetector.from_context(tuned)
    assert (links.watchdog_ns, links.stable_ns, links.quarantine_flaps) == (0, 3 * S, 2)


# --- behaviour (ported from the detectors before the processor contract) ---

def test_link_flap_opens_fails_over_then_restores() -> None:
    """Downs shorter than the watchdog: the flap rule alone fails over (tests/test_link_decisions.py: the rest)."""
    det = Fed(LinkFlapDetector(window_ns=10 * S, min_transitions=3, stable_ns=5 * S, watchdog_ns=10 * S))
    assert det(link(T0, True, 0)) == []
    assert det(link(T0 + S, False, 1)) == []
    assert det(link(T0 + 2 * S, True, 2)) == []
    inc, cmd = det(link(T0 + 3 * S, False, 3))
    assert isinstance(inc, Incident) and inc.kind == "link_flap" and inc.state == "open"
    assert inc.detail == "3 carrier changes within 10 s"
    assert isinstance(cmd, CommandIntent) and cmd.action == "failover" and cmd.node == "node-1"
    assert cmd.params == {"from": "eth0", "to": "eth1"} and cmd.incident_id == inc.incident_id
    assert inc.command_ids == [command_id_of(cmd)]
    assert det(link(T0 + 4 * S, True, 4)) == []      # still unstable
    assert det(link(T0 + 8 * S, True, 4)) == []      # up 4 s: not yet stable
    inc2, cmd2 = det(link(T0 + 9 * S, True, 4))
    assert inc2.state == "resolve" and inc2.incident_id == inc.incident_id
    assert cmd2.action == "restore" and cmd2.target == "eth0" and cmd2.incident_id == inc.incident_id
    assert cmd2.params == {"from": "eth1", "to": "eth0"}
    assert inc2.command_ids == [command_id_of(cmd), command_id_of(cmd2)]


def test_slow_carrier_changes_are_not_a_flap() -> None:
    det = Fed(LinkFlapDetector(window_ns=10 * S, min_transitions=3, watchdog_ns=HOUR))
    det(link(T0, True, 0))
    for i in range(1, 6):
        assert det(link(T0 + i * 11 * S, i % 2 == 0, i)) == []


def test_counter_jump_between_reports_counts_every_change() -> None:
    det = Fed(LinkFlapDetector(min_transitions=3))
    det(link(T0, True, 10))
    out = det(link(T0 + S, True, 14))   # 4 changes happened between two reports
    assert out and out[0].kind == "link_flap" and out[0].detail == "4 carrier changes within 10 s"


def test_ports_of_one_node_are_separate_entries() -> None:
    det = Fed(LinkFlapDetector(min_transitions=3))
    for i in range(4):   # two ports, each changing twice: no port reaches three
        assert det(link(T0 + i * S, i % 2 == 0, i // 2, iface="eth0" if i < 2 else "ib0")) == []
    ports = [k for k in det.store.backing if len(orjson.loads(k)) == 2]   # less the down ports' watchdog timers
    assert sorted(ports) == [b'["node-1","eth0"]', b'["node-1","ib0"]']


def test_gpu_detector_xid79_asks_the_allocator_for_one_replacement() -> None:
    det = Fed(GpuFaultDetector())
    assert det(gpu(T0, temperature_c=60)) == []
    inc, req = det(gpu(T0 + S, xid=79))
    assert (inc.kind, inc.state, inc.command_ids) == ("gpu_xid", "open", [])
    assert "asked of the fleet's allocator" in inc.detail
    assert isinstance(req, ReplacementRequest)
    assert (req.node, req.ts_ns, req.incident_id, req.reason, req.gpu) == ("node-3", T0 + S, inc.incident_id,
                                                                          "gpu_xid", 5)
    assert det(gpu(T0 + 2 * S, lost=True)) == []     # same failure: no second request


def test_gpu_detector_ecc_and_thermal() -> None:
    det = Fed(GpuFaultDetector())
    det(gpu(T0))
    (ecc,) = det(gpu(T0 + S, ecc_uncorrected=1))
    assert ecc.kind == "gpu_ecc"
    assert det(gpu(T0 + 2 * S, ecc_uncorrected=1)) == []
    assert det(gpu(T0 + 3 * S, ecc_uncorrected=1, throttle_reasons=0x40, temperature_c=60)) == []   # not sustained
    (hot,) = det(gpu(T0 + 4 * S, ecc_uncorrected=1, throttle_reasons=0x60, temperature_c=60))
    assert (hot.kind, hot.state, hot.severity) == ("gpu_thermal", "open", "critical")
    assert det(gpu(T0 + 5 * S, ecc_uncorrected=1)) == []      # one cool reading is not enough
    (cool,) = det(gpu(T0 + 6 * S, ecc_uncorrected=1))
    assert cool.state == "resolve" and cool.incident_id == hot.incident_id


def test_an_xid_reading_that_races_a_newer_periodic_one_is_still_applied() -> None:
    """The XID thread's reading can reach the topic after a newer periodic reading of the same GPU."""
    det = Fed(GpuFaultDetector())
    det(gpu(T0))
    assert det(gpu(T0 + 2 * S)) == []
    out = det(gpu(T0 + S, xid=79))
    assert [type(e).__name__ for e in out] == ["Incident", "ReplacementRequest"]


def test_a_reading_more_than_stale_ns_older_than_the_newest_is_not_applied() -> None:
    det = Fed(GpuFaultDetector())
    for i in range(1, 9):
        det(gpu(T0 + i * S))
    assert det(gpu(T0 + 8 * S - STALE_NS - 1, xid=48)) == []      # stale
    assert det.proc.redelivered == 1
    assert det(gpu(T0 + S + S // 2, xid=48)) != []   # out of order, within STALE_NS of the newest: applied
    assert det(gpu(T0 + 3 * S, xid=48)) == []        # a copy of one applied


# --- state: codec, keys, expiry ---

def test_one_event_per_batch_gives_what_one_batch_gives() -> None:
    """Each batch decodes the state the previous one encoded: the codec loses nothing the detectors use."""
    for make, events in ((LinkFlapDetector, flap_and_recover()), (GpuFaultDetector, hot_cool_hot())):
        together = worker(make()).run(0, events)
        apart = [e for out in one_by_one(worker(make()), events) for e in out]
        assert apart == together and len(together) >= 4


def test_state_round_trips_with_an_open_incident_and_its_outputs() -> None:
    det = LinkFlapDetector()
    store = StateStore(det)
    opened = [e for ev in flap_and_recover()[:4] for e in det.process(store, ev)]
    port = store.get('["node-1","eth0"]')
    again = det.decode_state(det.encode_state(port))
    assert again == port and again.incident_id == opened[0].incident_id
    assert [type(e).__name__ for e in opened] == ["Incident", "CommandIntent", "Incident"]
    assert again.log.outputs_of(T0 + 2 * S) == opened[:2] and again.log.outputs_of(T0 + 3 * S) == opened[2:]
    timer = store.get('["node-1","eth0","watchdog"]')   # eth0 went down again at 3 s
    assert timer is not None and det.decode_state(det.encode_state(timer)) == timer
    g = GpuFaultDetector()
    gstore = StateStore(g)
    outs = [g.process(gstore, ev) for ev in hot_cool_hot()]
    entry = gstore.get("node-3|5")
    assert g.decode_state(g.encode_state(entry)) == entry and entry.log.outputs_of(T0 + 4 * S) == outs[-1]


class Written(dict):
    """A table that records the keys written to it."""

    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []

    def __setitem__(self, key: bytes, value: bytes) -> None:
        self.written.append(key)
        super().__setitem__(key, value)


def test_entries_are_keyed_within_the_events_partition_key() -> None:
    for det, events in ((LinkFlapDetector(), flap_and_recover("a") + flap_and_recover("b|x")),
                        (GpuFaultDetector(), [gpu(T0, node="a"), gpu(T0, node="b|x", xid=79)])):
        table = Written()
        store = StateStore(det, table)
        for e in events:
            det.process(store, e)
            store.flush()
            assert table.written and all(orjson.loads(k)[0] == det.partition_key(e) if k.startswith(b"[")
                                         else k.decode().rsplit("|", 1)[0] == det.partition_key(e)
                                         for k in table.written)
            table.written.clear()
        assert len(table) == 2


def test_a_port_silent_for_the_ttl_expires_and_an_open_incident_is_counted() -> None:
    det = LinkFlapDetector(ttl_ns=24 * HOUR)
    w = worker(det)
    w.run(0, flap_and_recover()[:4])                       # eth0 flapping: incident open, down since 3 s
    w.run(0, [link(T0 + 24 * HOUR, True, 0, iface="ib0")])   # the node reports only ib0 a day later
    assert (det.expired_open, w.store.expired) == (0, 1)   # eth0's watchdog timer fired (already failed over)
    w.run(0, [link(T0 + 24 * HOUR + 3 * S + 1, True, 0, iface="ib0")])
    assert (det.expired_open, w.store.expired) == (1, 2) and sorted(w.store.backing) == [b'["node-1","ib0"]']


def test_gpu_entries_expire_after_the_ttl() -> None:
    det = GpuFaultDetector(ttl_ns=HOUR)
    w = worker(det)
    w.run(0, [gpu(T0, xid=48)])
    w.run(0, [gpu(T0 + HOUR + 1, index=6)])
    assert det.expired_open == 1 and sorted(w.store.backing) == [b"node-3|6"]


def test_two_workers_give_the_answers_of_one() -> None:
    events = sorted(flap_and_recover("node-a") + flap_and_recover("node-b") + flap_and_recover("node-c"),
                    key=lambda e: e.ts_ns)
    one = worker(LinkFlapDetector()).run(0, events)
    owner = {"node-a": 0, "node-b": 1, "node-c": 1}     # the records are keyed by node: any split by node
    apart = [worker(LinkFlapDetector()).run(p, [e for e in events if owner[e.node] == p]) for p in range(2)]
    assert all(apart) and len(one) == 15
    assert sorted(e.model_dump_json() for e in apart[0] + apart[1]) == sorted(e.model_dump_json() for e in one)


# --- kill -9 and replay ---

def _kill_and_replay(make, events: Sequence[Event], k: int) -> None:
    """Apply events one batch each, restart a fresh worker over the table, replay events[k:]: the replay
    changes no state and emits exactly what those events emitted before (signed alike), nothing new."""
    table: dict[bytes, bytes] = {}
    first = one_by_one(worker(make(), table), events)
    before = dict(table)
    det = make()
    again = one_by_one(worker(det, table), events[k:])
    assert again == first[k:]
    assert table == before
    assert {c: det.counters()[c] for c in ("redelivered", "expired_open")} == {"redelivered": len(events) - k,
                                                                              "expired_open": 0}


def test_link_flap_replay_after_a_kill_re_emits_and_changes_nothing() -> None:
    events = flap_and_recover()
    for k in range(len(events)):
        _kill_and_replay(LinkFlapDetector, events, k)


def test_gpu_replay_after_a_kill_re_emits_and_changes_nothing() -> None:
    """Before this, replaying the 2 s reading over state that saw 3 s resolved the incident opened at 3 s."""
    events = hot_cool_hot()
    for k in range(len(events)):
        _kill_and_replay(GpuFaultDetector, events, k)


def test_a_replayed_batch_after_a_kill_mid_batch_gives_the_same() -> None:
    """A worker that died before flushing replays over the state before the batch: the same outputs."""
    table: dict[bytes, bytes] = {}
    events = flap_and_recover()
    w = worker(LinkFlapDetector(), table)
    w.run(0, events[:2])
    before = dict(table)
    out = w.run(0, events[2:])
    table.clear()
    table.update(before)     # its changelog writes never made it
    assert worker(LinkFlapDetector(), table).run(0, events[2:]) == out


def test_replay_continues_like_an_uninterrupted_worker() -> None:
    events = flap_and_recover() + [link(T0 + 16 * S, False, 5), link(T0 + 17 * S, True, 6),
                                   link(T0 + 18 * S, False, 7)]
    straight = one_by_one(worker(LinkFlapDetector()), events)
    table: dict[bytes, bytes] = {}
    one_by_one(worker(LinkFlapDetector(), table), events[:6])
    resumed = one_by_one(worker(LinkFlapDetector(), table), events[3:])
    assert resumed == straight[3:] and [type(e).__name__ for e in resumed[-2]] == ["Incident", "ControlCommand"]
    assert [(e.kind, e.state) for e in resumed[-1]] == [("link_flap", "update")]   # the second incident flaps


def test_a_replayed_xid79_re_emits_its_replacement_request() -> None:
    table: dict[bytes, bytes] = {}
    (first,) = one_by_one(worker(GpuFaultDetector(), table), [gpu(T0, xid=79)])
    assert [type(e).__name__ for e in first] == ["Incident", "ReplacementRequest"]
    assert worker(GpuFaultDetector(), table).run(0, [gpu(T0, xid=79)]) == first


def test_delivery_log_keeps_positions_and_reads_entries_written_before_them() -> None:
    from clocktower.streams.delivery import Delivery
    from clocktower.streams.detectors.delivery_log import DeliveryLog

    log = DeliveryLog()
    inc = Incident(node="n", ts_ns=T0, incident_id="i", kind="gpu_xid", state="open", severity="info", target="t",
                   opened_ns=T0, detail="")
    log.applied(T0, [inc], Delivery("telemetry.gpu:3", 7, 1))
    back = DeliveryLog.from_dict(orjson.loads(orjson.dumps(log.to_dict())))
    assert back == log
    assert back.was_applied(T0, Delivery("telemetry.gpu:3", 7, 1)) and back.outputs_of(T0, Delivery(
        "telemetry.gpu:3", 7, 1)) == [inc]
    assert not back.was_applied(T0 + 1, Delivery("telemetry.gpu:3", 7, 2))   # a later position, a new time
    assert back.was_applied(T0, Delivery("telemetry.gpu:3", 9, 0))           # a copy at a later position
    old = DeliveryLog.from_dict({"seen": [T0], "emitted": [[T0, [{"incident": inc.model_dump()}]]]})
    assert old.outputs_of(T0) == [inc] and old.upto == {}
