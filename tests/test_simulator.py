"""Tests of the fleet simulator: shape of the telemetry, faults, clocks, codec validity, runner."""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections import Counter, defaultdict
from itertools import groupby
from pathlib import Path

import pytest

from clocktower.producers.event_builder import EventBuilder
from clocktower.producers.simulator import FleetSimulator, SimConfig, run_simulation
from clocktower.producers.simulator.fault_schedule import (
    KINDS,
    RANDOM_XIDS,
    SLOWDOWN_C,
    THERMAL_THROTTLE,
    WARMUP_FRACTION,
    default_kinds,
)
from clocktower.producers.simulator.gpus import POWER_CAP
from clocktower.producers.simulator.node_clock import NodeClock
from clocktower.schemas.codec import decode_batch, encode_batch
from clocktower.schemas.event import Event
from clocktower.schemas.operations import InjectedFault
from clocktower.schemas.telemetry import (
    ClockProbe,
    CollectiveEvent,
    FlowSample,
    GpuHealth,
    IterationEvent,
    LinkState,
    NodeHeartbeat,
)
from clocktower.schemas.topics import TELEMETRY, topic_for

S = 1_000_000_000
MS = 1_000_000
START = 1_700_000_000 * S
D = 8.0


def run(config: SimConfig, seconds: float, tick_s: float = 0.1) -> tuple[FleetSimulator, list[Event]]:
    """A simulator started at START and advanced `seconds` in ticks, with everything it emitted."""
    sim = FleetSimulator(config, start_ns=START)
    events: list[Event] = []
    end = sim.start_ns + round(seconds * S)
    while sim.now_ns < end:
        events += sim.advance(min(end, sim.now_ns + round(tick_s * S)))
    return sim, events


@pytest.fixture(scope="module")
def demo() -> tuple[FleetSimulator, list[Event]]:
    """The default fleet (4 x 8) with the default faults, over the shortest supported run."""
    return run(SimConfig(duration_s=D), D)


def of(events: list[Event], model: type[Event]) -> list:
    return [e for e in events if type(e) is model]


def true_s(sim: FleetSimulator, node: str, local_ns: int) -> float:
    """Seconds since the start of the run, in true time, of a node's timestamp."""
    return (sim.clocks[node].to_true(local_ns) - sim.start_ns) / S


def fault(sim: FleetSimulator, kind: str) -> InjectedFault:
    (f,) = [f for f in sim.faults if f.kind == kind]
    return f


def window_s(sim: FleetSimulator, kind: str) -> tuple[float, float]:
    f = fault(sim, kind)
    return (f.start_ns - sim.start_ns) / S, (f.end_ns - sim.start_ns) / S


# --- configuration -------------------------------------------------------------------------------


def test_fewer_than_two_nodes_is_rejected() -> None:
    with pytest.raises(ValueError, match="at least 2 nodes"):
        SimConfig(nodes=1)
    with pytest.raises(ValueError, match="at least 2 nodes"):
        FleetSimulator(SimConfig.model_construct(nodes=1))


@pytest.mark.parametrize("bad", [{"nodes": 4097}, {"gpus_per_node": 0}, {"duration_s": 0}, {"buckets": 0},
                                 {"gpu_health_hz": 0}, {"probe_peers": 0}, {"segments_per_bucket": 0},
                                 {"unknown": 1}])
def test_config_ranges_are_validated(bad: dict) -> None:
    with pytest.raises(ValueError):
        SimConfig(**bad)


def test_defaults() -> None:
    c = SimConfig()
    assert (c.nodes, c.gpus_per_node, c.duration_s, c.buckets, c.bucket_bytes, c.segments_per_bucket) == \
        (4, 8, 60.0, 4, 64 * 2**20, 8)
    sim = FleetSimulator(c)
    assert abs(sim.start_ns - time.time_ns()) < 5 * S
    assert sim.now_ns == sim.start_ns
    assert list(sim.clocks) == ["node-0.demo", "node-1.demo", "node-2.demo", "node-3.demo"]


# --- determinism ---------------------------------------------------------------------------------


def test_same_seed_same_events(demo: tuple[FleetSimulator, list[Event]]) -> None:
    _, events = demo
    _, again = run(SimConfig(duration_s=D), D)
    assert again == events
    _, other = run(SimConfig(duration_s=D, seed=1), 2.0)
    assert other != events[:len(other)]


def test_events_do_not_depend_on_tick_size() -> None:
    config = SimConfig(duration_s=D)
    _, fine = run(config, 3.0, tick_s=0.05)
    _, coarse = run(config, 3.0, tick_s=0.7)
    assert len(fine) == len(coarse)
    assert sorted(e.model_dump_json() for e in fine) == sorted(e.model_dump_json() for e in coarse)


def test_advance_windows() -> None:
    sim = FleetSimulator(SimConfig(duration_s=D), start_ns=START)
    assert sim.advance(START) == []
    first = sim.advance(START + S)
    assert sim.now_ns == START + S
    assert sim.advance(START + S // 2) == []
    assert sim.now_ns == START + S
    assert first and sum(sim.counts.values()) == len(first)
    assert sim.counts == Counter(type(e).SCHEMA for e in first)


# --- every schema, valid through the codec -------------------------------------------------------


def test_every_telemetry_schema_is_emitted(demo: tuple[FleetSimulator, list[Event]]) -> None:
    sim, events = demo
    # eBPF socket counters and connection lifecycle come from the real node agent only: the simulator
    # models traffic as flow segments (FlowSample)
    agent_only = {"flow_counters", "connection_state"}
    assert set(sim.counts) == {spec.model.SCHEMA for spec in TELEMETRY} - agent_only
    assert sim.counts == Counter(type(e).SCHEMA for e in events)


def test_events_pass_the_codec(demo: tuple[FleetSimulator, list[Event]]) -> None:
    sim, events = demo
    key = lambda e: (type(e).SCHEMA, e.node)  # noqa: E731
    checked = Counter()
    for (schema, _), group in groupby(sorted(events + sim.faults, key=key), key=key):
        batch = list(group)
        k, v, headers = encode_batch(batch)
        decoded = decode_batch(topic_for(type(batch[0])).name, k, v, headers)
        assert decoded.events == batch
        checked[schema] += len(batch)
    assert sum(checked.values()) == len(events) + len(sim.faults)


def test_fast_builder_equals_validated_model() -> None:
    build = EventBuilder(LinkState)
    fields = dict(node="node-0.demo", ts_ns=START, interface="eth0", kind="ethernet", up=True, carrier_changes=1,
                  speed_mbps=400_000, operstate="up", carrier=True)
    assert build(**fields) == LinkState(**fields)
    assert build(**fields, port_rcv_data=8) == LinkState(**fields, port_rcv_data=8)
    assert EventBuilder(GpuHealth).missing({"node": "n"}) >= {"ts_ns", "gpu", "uuid", "nvlink_errors", "power_w"}


def test_fast_builder_refuses_what_validation_refuses() -> None:
    """A required field left out is an error, not a default: the builder must not fake a reading."""
    build = EventBuilder(LinkState)
    fields = dict(node="node-0.demo", ts_ns=START, interface="eth0", kind="ethernet", up=True, carrier_changes=1,
                  operstate="up", carrier=True)
    with pytest.raises(TypeError, match="speed_mbps"):
        build(**fields)
    with pytest.raises(TypeError, match="port_rcv_data"):   # an IB port's counters apply: required
        build(**{**fields, "speed_mbps": 200_000, "kind": "infiniband"})
    with pytest.raises(TypeError, match="bogus"):
        build(**fields, speed_mbps=1, bogus=1)


# --- faults --------------------------------------------------------------------------------------


def test_ground_truth_has_every_kind_inside_the_run(demo: tuple[FleetSimulator, list[Event]]) -> None:
    sim, _ = demo
    assert sorted(f.kind for f in sim.faults) == sorted(default_kinds(D)) == sorted(set(KINDS) - {"node_silent"})
    assert len({f.fault_id for f in sim.faults}) == len(KINDS) - 1
    for f in sim.faults:
        assert sim.start_ns < f.start_ns <= f.end_ns <= sim.start_ns + D * S
        assert f.ts_ns == f.start_ns and f.node in sim.clocks
    assert {f.kind: f.target for f in sim.faults} == {
        "link_flap": "node-1.demo:eth0", "link_blip": "node-2.demo:eth0", "congestion": "node-2.demo->node-3.demo",
        "gpu_thermal": "node-0.demo:gpu3", "gpu_xid": "node-3.demo:gpu5", "gpu_ecc": "node-2.demo:gpu1",
        "straggler": "job-demo:rank9"}


@pytest.mark.parametrize("duration", [1.0, 8.0, 60.0, 86_400.0])
def test_faults_fit_any_run(duration: float) -> None:
    sim = FleetSimulator(SimConfig(duration_s=duration), start_ns=START)
    assert sorted(f.kind for f in sim.faults) == sorted(default_kinds(duration))
    for f in sim.faults:
        assert START < f.start_ns <= f.end_ns <= START + duration * S
    (flap,) = sim.schedule.by_kind("link_flap")
    assert len(flap.transitions) == 6 and flap.transitions[-1] == flap.end_ns
    gaps = {b - a for a, b in zip(flap.transitions, flap.transitions[1:], strict=False)}
    assert gaps == ({3 * S // 10} if duration >= 8 else {round(0.7 * duration / 5 * S)})


@pytest.mark.parametrize("nodes,gpus", [(2, 8), (3, 2), (2, 1)])
def test_small_fleets_get_every_fault(nodes: int, gpus: int) -> None:
    sim, events = run(SimConfig(nodes=nodes, gpus_per_node=gpus, duration_s=D), D, tick_s=1.0)
    assert sorted(f.kind for f in sim.faults) == sorted(default_kinds(D))
    assert all(f.node in sim.clocks for f in sim.faults)
    assert any(isinstance(e, GpuHealth) and e.xid == 79 for e in events)
    assert any(isinstance(e, LinkState) and not e.up for e in events)


def test_no_faults() -> None:
    sim, events = run(SimConfig(duration_s=D, faults=False), 4.0)
    assert sim.faults == []
    assert not any(isinstance(e, LinkState) and not e.up for e in events)
    assert not any(isinstance(e, GpuHealth) and (e.xid or e.lost or e.throttle_reasons & ~POWER_CAP)
                   for e in events)


def test_background_noise_shows_power_caps_and_swings_but_no_fault() -> None:
    sim, events = run(SimConfig(duration_s=60, faults=False, seed=3), 60.0)
    gpus = of(events, GpuHealth)
    capped = {(e.node, e.gpu) for e in gpus if e.throttle_reasons == POWER_CAP}
    assert capped and all(e.throttle_reasons in (0, POWER_CAP) for e in gpus)
    temps = [e.temperature_c for e in gpus if (e.node, e.gpu) == ("node-0.demo", 0)]
    assert max(temps) - min(temps) > 2.0 and max(e.temperature_c for e in gpus) < 80
    assert max(e.ecc_corrected for e in gpus) > 0 and not any(e.ecc_uncorrected for e in gpus)
    quiet = run(SimConfig(duration_s=60, faults=False, seed=3, background_noise=False), 20.0)[1]
    assert not any(e.throttle_reasons for e in of(quiet, GpuHealth))


def test_random_schedules_put_every_kind_in_its_own_slot_after_the_warm_up() -> None:
    seen_xids = set()
    for seed in range(8):
        config = SimConfig(duration_s=60, seed=seed, schedule="random")
        sim = FleetSimulator(config, start_ns=START)
        windows = sim.schedule.windows
        assert sorted(w.kind for w in windows) == sorted(KINDS)
        assert windows[0].start_ns >= START + WARMUP_FRACTION * 60 * S
        finite = [w for w in windows if w.xid != 79]
        for w, nxt in zip(windows, windows[1:], strict=False):
            assert w.start_ns < nxt.start_ns and (w not in finite or w.end_ns < nxt.start_ns)   # no overlap
        seen_xids |= {w.xid for w in windows if w.kind == "gpu_xid"}
        other = FleetSimulator(config.model_copy(update={"seed": seed + 100}), start_ns=START).schedule.windows
        assert [w.fault.target for w in other] != [w.fault.target for w in windows]
    assert seen_xids <= set(RANDOM_XIDS) and len(seen_xids) >= 2


def test_a_silent_node_sends_nothing_in_its_window() -> None:
    """On runs of 30 s or more the default schedule silences the last node (shorter: no room for it)."""
    assert "node_silent" not in {f.kind for f in FleetSimulator(SimConfig(duration_s=29), start_ns=START).faults}
    sim, events = run(SimConfig(duration_s=30), 30.0)
    a, b = window_s(sim, "node_silent")
    mine = [true_s(sim, e.node, e.ts_ns) for e in events if e.node == "node-3.demo"
            and isinstance(e, NodeHeartbeat | GpuHealth | LinkState)]
    assert mine and not any(a + 0.01 < t < b - 0.01 for t in mine)
    beats = [e for e in of(events, NodeHeartbeat) if e.node == "node-3.demo"]
    assert any(true_s(sim, e.node, e.ts_ns) > b for e in beats)          # it comes back
    others = [e for e in of(events, NodeHeartbeat) if e.node == "node-0.demo"]
    assert len(others) >= 30 / 0.2 - 1 and {e.interval_ms for e in others} == {200}


def test_link_blip(demo: tuple[FleetSimulator, list[Event]]) -> None:
    sim, events = demo
    f = fault(sim, "link_blip")
    port = [e for e in of(events, LinkState) if (e.node, e.interface) == ("node-2.demo", "eth0")]
    down, up = [next(e for e in port if e.carrier_changes == c) for c in (2, 3)]
    assert not down.up and up.up and port[-1].carrier_changes == 3
    assert true_s(sim, "node-2.demo", down.ts_ns) == pytest.approx((f.start_ns - sim.start_ns) / S, abs=1e-5)
    length = true_s(sim, "node-2.demo", up.ts_ns) - true_s(sim, "node-2.demo", down.ts_ns)
    assert length == pytest.approx(0.03, abs=1e-5)


def test_link_flap(demo: tuple[FleetSimulator, list[Event]]) -> None:
    sim, events = demo
    f = fault(sim, "link_flap")
    port = [e for e in of(events, LinkState) if (e.node, e.interface) == ("node-1.demo", "eth0")]
    changes = [e.carrier_changes for e in port]
    assert changes == sorted(changes) and changes[0] == 1 and changes[-1] == 7
    # one report at each transition, alternating down/up, 0.3 s apart
    first = {}
    for e in port:
        first.setdefault(e.carrier_changes, e)
    transitions = [first[c] for c in range(2, 8)]
    assert [e.up for e in transitions] == [False, True] * 3
    times = [true_s(sim, "node-1.demo", e.ts_ns) for e in transitions]
    assert times[0] == pytest.approx((f.start_ns - sim.start_ns) / S, abs=1e-5)
    assert [round(b - a, 3) for a, b in zip(times, times[1:], strict=False)] == [0.3] * 5
    assert all(e.speed_mbps == 0 for e in port if not e.up)
    # the other ports never flap (but node-2's blips: test_link_blip), and report every second
    others = [e for e in of(events, LinkState) if (e.node, e.interface) not in (("node-1.demo", "eth0"),
                                                                                ("node-2.demo", "eth0"))]
    assert all(e.up and e.carrier_changes == 1 and e.speed_mbps == 400_000 for e in others)
    ports = {(f"node-{i}.demo", ifc): 8 for i in range(4) for ifc in ("eth0", "eth1")}
    del ports[("node-1.demo", "eth0")], ports[("node-2.demo", "eth0")]
    assert Counter((e.node, e.interface) for e in others) == ports
    assert len(port) == 8 + 6
    # flows touching node-1.demo move to eth1 exactly while its eth0 is down
    down = [(times[i], times[i + 1]) for i in (0, 2, 4)]
    for e in of(events, FlowSample):
        if e.direction == "tx" and "node-1.demo" in (e.node, _receiver(e)):
            t = true_s(sim, e.node, e.ts_ns)
            assert (e.interface == "eth1") == any(a <= t < b for a, b in down)
            assert e.src_ip.startswith("198.19." if e.interface == "eth1" else "198.18.")


def _receiver(e: FlowSample) -> str:
    return f"node-{e.dst_ip.split('.')[2]}.demo"


def test_xid_79_then_lost(demo: tuple[FleetSimulator, list[Event]]) -> None:
    sim, events = demo
    start, _ = window_s(sim, "gpu_xid")
    gpu = [e for e in of(events, GpuHealth) if (e.node, e.gpu) == ("node-3.demo", 5)]
    xid = [i for i, e in enumerate(gpu) if e.xid]
    assert len(xid) == 1 and gpu[xid[0]].xid == 79 and not gpu[xid[0]].lost
    assert start <= true_s(sim, "node-3.demo", gpu[xid[0]].ts_ns) < start + 0.1 + 1e-6
    assert all(not e.lost for e in gpu[:xid[0] + 1])
    after = gpu[xid[0] + 1:]
    assert len(after) > 20
    for e in after:
        assert e.lost and e.uuid == "GPU-node-3.demo-5"
        assert e.temperature_c is e.power_w is e.sm_clock_mhz is e.gpu_util_pct is None   # no reading, not 0
        assert e.mem_used_bytes is e.throttle_reasons is None and e.xid == 0


def test_ecc_uncorrected(demo: tuple[FleetSimulator, list[Event]]) -> None:
    sim, events = demo
    start, _ = window_s(sim, "gpu_ecc")
    gpu = [e for e in of(events, GpuHealth) if (e.node, e.gpu) == ("node-2.demo", 1)]
    ecc = [e.ecc_uncorrected for e in gpu]
    flip = ecc.index(1)
    assert set(ecc[:flip]) == {0} and set(ecc[flip:]) == {1}
    assert [e.xid for e in gpu if e.xid] == [48] and gpu[flip].xid == 48
    assert start <= true_s(sim, "node-2.demo", gpu[flip].ts_ns) < start + 0.1 + 1e-6
    assert not any(e.ecc_uncorrected for e in of(events, GpuHealth) if (e.node, e.gpu) != ("node-2.demo", 1))


def test_thermal_throttle(demo: tuple[FleetSimulator, list[Event]]) -> None:
    """The GPU climbs for THERMAL_RAMP_S unthrottled, then reads 90-95 C, throttled; the rank slows once throttled."""
    sim, events = demo
    a, b = window_s(sim, "gpu_thermal")
    ramp_s = sim.schedule.by_kind("gpu_thermal")[0].ramp_ns / S
    assert ramp_s == pytest.approx((b - a) / 3, abs=1e-6)      # a short run: a third of the window
    hot = climbing = cold = 0
    for e in of(events, GpuHealth):
        if e.lost:
            continue
        t = true_s(sim, e.node, e.ts_ns)
        if (e.node, e.gpu) == ("node-0.demo", 3) and a <= t <= b:
            if t < a + ramp_s:
                climbing += 1
                assert e.throttle_reasons & THERMAL_THROTTLE == 0 and 55 <= e.temperature_c < SLOWDOWN_C
                continue
            hot += 1
            assert e.throttle_reasons & THERMAL_THROTTLE == 0x60
            assert 90 <= e.temperature_c <= 95 and 1150 <= e.sm_clock_mhz <= 1250
        else:
            cold += 1
            assert e.throttle_reasons in (0, POWER_CAP) and 55 <= e.temperature_c <= 77
            assert 1950 <= e.sm_clock_mhz <= 1980 or (e.throttle_reasons and 1600 <= e.sm_clock_mhz < 1700)
            assert 450 <= e.power_w <= 700 and e.mem_clock_mhz == 2619 and e.nvlink_errors == [0] * 18
    assert hot >= 6 and climbing >= 3 and cold > 2000
    ramp = [e.temperature_c for e in of(events, GpuHealth) if (e.node, e.gpu) == ("node-0.demo", 3)
            and a <= true_s(sim, e.node, e.ts_ns) < a + ramp_s]
    assert ramp[-1] - ramp[0] > 10 and ramp[-1] > 80    # it climbs toward the slowdown threshold
    # rank 3 computes 1.3x slower once throttled; the others wait for it in the first bucket
    compute = _compute_ms(sim, events, 3)
    hot_from = a + ramp_s
    assert statistics.median(v for t, v in compute if hot_from + 0.01 < t < b - 0.01) == pytest.approx(260, rel=0.05)
    assert statistics.median(v for t, v in compute if t < hot_from - 0.01) == pytest.approx(200, rel=0.05)
    wait = _first_bucket_ms(sim, events, 0)
    assert statistics.median(v for t, v in wait if hot_from + 0.01 < t < b - 0.01) > 60
    assert statistics.median(v for t, v in wait if t < a - 0.3 and not _near_fault(sim, t)) < 30


def test_straggler(demo: tuple[FleetSimulator, list[Event]]) -> None:
    sim, events = demo
    a, b = window_s(sim, "straggler")
    compute = _compute_ms(sim, events, 9)
    assert statistics.median(v for t, v in compute if a + 0.01 < t < b - 0.01) == pytest.approx(300, rel=0.05)
    iters = {r: [(true_s(sim, e.node, e.start_ns), (e.end_ns - e.start_ns) / MS)
                 for e in of(events, IterationEvent) if e.rank == r] for r in (0, 9)}
    for r in (0, 9):   # synchronous: everyone's iteration stretches
        assert statistics.median(v for t, v in iters[r] if a + 0.01 < t < b - 0.01) > 340


def _compute_ms(sim: FleetSimulator, events: list[Event], rank: int) -> list[tuple[float, float]]:
    """(iteration start s, compute ms) of a rank: iteration start to its first all-reduce start."""
    starts = {e.iteration: e for e in of(events, IterationEvent) if e.rank == rank}
    firsts = [e for e in of(events, CollectiveEvent) if e.rank == rank and e.seq % 4 == 0]
    return [(true_s(sim, it.node, it.start_ns), (c.start_ns - it.start_ns) / MS)
            for c in firsts if (it := starts.get(c.seq // 4))]


def _first_bucket_ms(sim: FleetSimulator, events: list[Event], rank: int) -> list[tuple[float, float]]:
    return [(true_s(sim, e.node, e.start_ns), (e.end_ns - e.start_ns) / MS)
            for e in of(events, CollectiveEvent) if e.rank == rank and e.seq % 4 == 0]


def _near_fault(sim: FleetSimulator, t: float) -> bool:
    return any((f.start_ns - sim.start_ns) / S - 0.3 <= t <= (f.end_ns - sim.start_ns) / S + 0.3
               for f in sim.faults if f.kind in ("congestion", "link_flap"))


def test_congestion_raises_flow_latency(demo: tuple[FleetSimulator, list[Event]]) -> None:
    sim, events = demo
    a, b = window_s(sim, "congestion")
    lat = defaultdict(list)
    for tx, rx in _flow_pairs(events).values():
        t_tx = sim.clocks[tx.node].to_true(tx.ts_ns)
        t_rx = sim.clocks[rx.node].to_true(rx.ts_ns)
        t = (t_tx - sim.start_ns) / S
        phase = "during" if a + 0.05 < t < b - 0.05 else "outside" if not a - 0.05 <= t <= b + 0.05 else None
        if phase:
            lat[(tx.node, rx.node, phase)].append((t_rx - t_tx) / 1e3)
    congested = lat[("node-2.demo", "node-3.demo", "during")]
    assert len(congested) > 50 and min(congested) >= 50 and max(congested) <= 510
    assert 150 < statistics.median(congested) < 400
    for (src, dst, phase), v in lat.items():
        if (src, dst, phase) != ("node-2.demo", "node-3.demo", "during"):
            assert min(v) >= 4.9 and statistics.median(v) < 10, (src, dst, phase)
    # and the all-reduce buckets slow down for everyone
    later = [(true_s(sim, e.node, e.start_ns), (e.end_ns - e.start_ns) / MS)
             for e in of(events, CollectiveEvent) if e.seq % 4 == 2]
    assert statistics.median(v for t, v in later if a + 0.3 < t < b - 0.3) > 17
    assert 10 < statistics.median(v for t, v in later if not _near_fault(sim, t)) < 14


# --- flows ---------------------------------------------------------------------------------------


def _flow_pairs(events: list[Event]) -> dict[tuple, tuple[FlowSample, FlowSample]]:
    half: dict[tuple, dict[str, FlowSample]] = defaultdict(dict)
    for e in of(events, FlowSample):
        key = (e.src_ip, e.dst_ip, e.src_port, e.dst_port, e.proto, e.seq)
        assert e.direction not in half[key], f"duplicate {e.direction} for {key}"
        half[key][e.direction] = e
    return {k: (v["tx"], v["rx"]) for k, v in half.items() if len(v) == 2}


def test_flow_samples_pair_up(demo: tuple[FleetSimulator, list[Event]]) -> None:
    sim, events = demo
    flows = of(events, FlowSample)
    pairs = _flow_pairs(events)
    assert 2 * len(pairs) == len(flows) > 0
    ips = {f"198.{18 + k}.{i}.1": f"node-{i}.demo" for i in range(4) for k in (0, 1)}
    for tx, rx in pairs.values():
        assert (tx.bytes, tx.packets, tx.interface) == (rx.bytes, rx.packets, rx.interface)
        assert tx.packets == -(-tx.bytes // 4096)
        assert tx.node == ips[tx.src_ip] and rx.node == ips[tx.dst_ip]
        assert int(rx.node[5:].removesuffix(".demo")) == (int(tx.node[5:].removesuffix(".demo")) + 1) % 4
        assert tx.proto == "roce" and tx.dst_port == 4791 and tx.priority == rx.priority == 3
        assert 40000 <= tx.src_port < 40032 and (tx.src_port - 40000) // 8 == int(tx.node[5:].removesuffix(".demo"))
    # seq increases per flow (5-tuple), in send order
    by_flow = defaultdict(list)
    for e in flows:
        if e.direction == "tx":
            by_flow[(e.src_ip, e.dst_ip, e.src_port)].append(e.seq)
    assert all(s == list(range(1, len(s) + 1)) for s in by_flow.values())
    # each ring link carries bucket_bytes * 2(N-1)/N per bucket, in 8 segments
    assert {tx.bytes for tx, _ in pairs.values()} == {64 * 2**20 * 3 // 2 // 8}


# --- training ------------------------------------------------------------------------------------


def test_training_loop(demo: tuple[FleetSimulator, list[Event]]) -> None:
    sim, events = demo
    coll = defaultdict(list)
    for e in of(events, CollectiveEvent):
        coll[e.rank].append(e)
        assert (e.job, e.communicator, e.op, e.bytes) == ("job-demo", "world", "allreduce", 64 * 2**20)
        assert e.ts_ns == e.end_ns >= e.start_ns and e.node == f"node-{e.rank // 8}.demo"
    its = defaultdict(list)
    for e in of(events, IterationEvent):
        its[e.rank].append(e)
        assert e.ts_ns == e.end_ns > e.start_ns
    assert sorted(coll) == sorted(its) == list(range(32))
    for r in range(32):
        assert [e.seq for e in coll[r]] == list(range(len(coll[r])))
        assert [e.iteration for e in its[r]] == list(range(len(its[r])))
        assert len(coll[r]) >= 4 * len(its[r])
        for it in its[r]:
            buckets = coll[r][4 * it.iteration: 4 * it.iteration + 4]
            assert it.start_ns < buckets[0].start_ns and buckets[-1].end_ns <= it.end_ns
    n = len(its[0])
    assert 8 / 0.40 < n < 8 / 0.22   # ~250 ms per iteration, slower while faults hit
    # synchronous: the same iteration ends at (nearly) the same true time on every rank
    for i in range(0, n, 5):
        ends = [sim.clocks[its[r][i].node].to_true(its[r][i].end_ns) for r in range(32)]
        assert max(ends) - min(ends) < 100_000


# --- GPUs, probes, clocks ------------------------------------------------------------------------


def test_gpu_health_readings(demo: tuple[FleetSimulator, list[Event]]) -> None:
    _, events = demo
    gpus = Counter((e.node, e.gpu, e.uuid) for e in of(events, GpuHealth))
    assert len(gpus) == 32 and set(gpus.values()) == {80}
    assert ("node-0.demo", 3, "GPU-node-0.demo-3") in gpus
    util = [e.gpu_util_pct for e in of(events, GpuHealth) if not e.lost]
    assert statistics.median(util) >= 90 and max(util) <= 100
    used = [e.mem_used_bytes / 2**30 for e in of(events, GpuHealth) if not e.lost]
    assert min(used) > 55 and max(used) < 65


def test_clock_probes_go_both_ways_on_a_sparse_graph() -> None:
    """With K < N-1, every probed pair of nodes probes in both directions and a node has about K peers."""
    sim = FleetSimulator(SimConfig(nodes=64, probe_peers=10, faults=False))
    routes = {(s, r) for s, r, _ in sim.probes.routes}
    assert all((r, s) in routes for s, r in routes)
    degree = Counter(s for s, _ in routes)
    assert len(degree) == 64 and min(degree.values()) >= 5
    assert 8 <= statistics.mean(degree.values()) <= 12


def test_clock_probes(demo: tuple[FleetSimulator, list[Event]]) -> None:
    sim, events = demo
    probes = of(events, ClockProbe)
    assert {n: len(p) for n, p in sim.probes.peers.items()} == {f"node-{i}.demo": 3 for i in range(4)}
    pairs = defaultdict(dict)
    for p in probes:
        assert p.node == p.receiver != p.sender and p.ts_ns == p.rx_ns
        pairs[p.pair_id][p.idx] = p
    assert all(set(v) == {0, 1} for v in pairs.values())
    assert all(v[1].tx_ns - v[0].tx_ns == 1000 for v in pairs.values())
    rates = Counter((v[0].sender, v[0].receiver) for v in pairs.values())
    assert len(rates) == 12 and all(abs(n - 10 * D) <= 1 for n in rates.values())
    # rx - tx mixes the delay with both clocks' offsets: the smallest is ~5 µs + (offset_r - offset_s)
    delay = defaultdict(list)
    for v in pairs.values():
        for p in v.values():
            t = sim.clocks[p.receiver].to_true(p.rx_ns)
            gap = sim.clocks[p.receiver].offset_at(t) - sim.clocks[p.sender].offset_at(t)
            delay[(p.sender, p.receiver)].append(p.rx_ns - p.tx_ns - gap)
    for (s, r), d in delay.items():
        assert min(d) > 4_600 and 4_900 < statistics.median(d) < 5_200, (s, r)
        if (s, r) != ("node-2.demo", "node-3.demo"):   # that link is congested for a while
            assert statistics.quantiles(d, n=20)[-1] < 30_000


def test_clock_ground_truth(demo: tuple[FleetSimulator, list[Event]]) -> None:
    sim, _ = demo
    offsets = []
    for clock in sim.clocks.values():
        assert abs(clock.offset_at(sim.start_ns)) <= 2_000_000
        for k in range(0, 9):
            t = sim.start_ns + k * S
            assert abs(clock.drift_ppm_at(t)) <= 30
            assert clock.local(t) == t + clock.offset_at(t)
            assert abs(clock.to_true(clock.local(t)) - t) <= 1
        t0, t1 = sim.start_ns + 2 * S, sim.start_ns + 3 * S
        drift_ppm = clock.drift_ppm_at(t0 + S // 2)
        assert clock.offset_at(t1) - clock.offset_at(t0) == pytest.approx(drift_ppm * 1e3, abs=2)
        offsets.append(clock.offset_at(sim.start_ns))
    assert len(set(offsets)) == 4


def test_clock_drift_wanders_but_stays_bounded() -> None:
    clock = NodeClock("n", START, 0.0, 29.99, wander_ppb_per_s=500.0, seed=3)
    drifts = [clock.drift_ppm_at(START + k * S) for k in range(3000)]
    assert max(drifts) <= 30 and min(drifts) >= -30 and len(set(drifts)) > 2900
    assert clock.offset_at(START - S) == pytest.approx(-29_990, abs=1)
    # answers do not depend on the order of queries
    fresh = NodeClock("n", START, 0.0, 29.99, wander_ppb_per_s=500.0, seed=3)
    assert fresh.offset_at(START + 2000 * S) == clock.offset_at(START + 2000 * S)
    with pytest.raises(ValueError):
        NodeClock("n", START, 0.0, 31.0)


def test_large_fleet_addresses() -> None:
    config = SimConfig(nodes=300, gpus_per_node=1, duration_s=D, buckets=1, segments_per_bucket=1)
    sim = FleetSimulator(config, start_ns=START)
    events = sim.advance(START + S // 4)
    ips = {e.src_ip for e in of(events, FlowSample)}
    assert len(ips) == 300 and "198.18.43.2" in ips   # node-299.demo wraps into the last octet
    degree = [len(p) for p in sim.probes.peers.values()]
    assert len(degree) == 300 and min(degree) >= 5 and 8 <= statistics.mean(degree) <= 12


# --- runner --------------------------------------------------------------------------------------


class ListPublisher:
    """Keeps what it is given, and when (the simulator's true time at each call)."""

    def __init__(self, sim: FleetSimulator) -> None:
        self.sim = sim
        self.calls: list[tuple[int, list[Event]]] = []
        self.events: list[Event] = []
        self.flushed = 0

    def publish(self, events: list[Event]) -> int:
        self.calls.append((self.sim.now_ns, list(events)))
        self.events.extend(events)
        return 1

    def flush(self) -> int:
        self.flushed += 1
        return 0


def test_runner_publishes_events_and_ground_truth(tmp_path: Path) -> None:
    sim = FleetSimulator(SimConfig(duration_s=D), start_ns=START)
    pub = ListPublisher(sim)
    ticks = []
    truth = tmp_path / "gt" / "faults.jsonl"
    counts = run_simulation(sim, pub, D, tick_s=0.25, realtime=False, ground_truth_path=truth,
                            on_tick=lambda s: ticks.append(s.now_ns))
    assert sim.now_ns == START + D * S and len(ticks) == 32 and pub.flushed == 1
    assert counts == Counter(type(e).SCHEMA for e in pub.events)
    assert counts["injected_fault"] == 7
    assert counts - Counter(injected_fault=7) == sim.counts
    lines = truth.read_text().splitlines()
    by_start = sorted(sim.faults, key=lambda f: f.start_ns)
    assert [InjectedFault.model_validate_json(x) for x in lines] == by_start
    assert {json.loads(x)["kind"] for x in lines} == set(default_kinds(D))
    # each fault is published once, in the tick in which it starts
    published = [(t, e) for t, events in pub.calls for e in events if isinstance(e, InjectedFault)]
    assert [e for _, e in published] == by_start
    assert all(t - S // 4 < e.start_ns <= t for t, e in published)


def test_runner_realtime_paces_and_stops_promptly() -> None:
    sim = FleetSimulator(SimConfig(duration_s=D))
    pub = ListPublisher(sim)
    t0 = time.monotonic()
    run_simulation(sim, pub, 0.3, tick_s=0.1, realtime=True)
    assert 0.25 < time.monotonic() - t0 < 1.5
    assert pub.events and pub.flushed == 1

    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    t0 = time.monotonic()
    pub.sim = FleetSimulator(SimConfig(duration_s=D))
    counts = run_simulation(pub.sim, pub, 30.0, tick_s=0.5, stop=stop)
    assert time.monotonic() - t0 < 1.0 and pub.flushed == 2
    assert sum(counts.values()) < 5000
