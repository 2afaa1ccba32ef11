"""The stream processors' pure logic: the latency join, iteration breakdown and detectors (which hold no key)."""

from __future__ import annotations

from clocktower.control.intent import CommandIntent
from clocktower.schemas.analytics import Incident
from clocktower.schemas.telemetry import CollectiveEvent, FlowSample, GpuHealth, IterationEvent, LinkState
from clocktower.streams.flow_latency_join import FlowLatencyJoin
from clocktower.streams.gpu_fault_detector import GpuFaultDetector
from clocktower.streams.iteration_breakdown import IterationBreakdownAggregator
from clocktower.streams.link_flap_detector import LinkFlapDetector
from tests.event_samples import GPU_READINGS

T0 = 1_780_000_000 * 10**9
KEY = b"k" * 32
S = 10**9


def flow(node: str, direction: str, ts: int, seq: int = 1) -> FlowSample:
    return FlowSample(node=node, ts_ns=ts, interface="eth0", direction=direction, src_ip="198.18.0.1",
                      dst_ip="198.18.1.1", src_port=40000, dst_port=4791, proto="roce", seq=seq, bytes=4096,
                      packets=1, retransmits=0, priority=3)


def test_join_pairs_tx_and_rx_in_either_order() -> None:
    j = FlowLatencyJoin()
    assert j.add(flow("node-0", "tx", T0)) is None
    r = j.add(flow("node-1", "rx", T0 + 7_000))
    assert r is not None and r.latency_ns == 7_000 and r.node == "node-1" and r.src_node == "node-0"
    assert r.clock_corrected is False and r.corrected_latency_ns is None
    assert j.add(flow("node-1", "rx", T0 + 9_000, seq=2)) is None
    r2 = j.add(flow("node-0", "tx", T0 + 1_000, seq=2))
    assert r2 is not None and r2.latency_ns == 8_000 and r2.tx_ns == T0 + 1_000
    assert not j.pending


def test_join_ignores_duplicates_and_bounds_pending() -> None:
    j = FlowLatencyJoin(max_pending=2)
    j.add(flow("node-0", "tx", T0, seq=1))
    assert j.add(flow("node-0", "tx", T0, seq=1)) is None and j.duplicates == 1
    j.add(flow("node-0", "tx", T0, seq=2))
    j.add(flow("node-0", "tx", T0, seq=3))
    assert j.evicted == 1 and len(j.pending) == 2
    assert j.add(flow("node-1", "rx", T0 + 5, seq=1)) is None  # seq 1 was evicted: no invented latency


def test_join_applies_clock_correction_when_known() -> None:
    class Clocks:
        def to_reference(self, node: str, local_ns: int):
            return (local_ns - 1_000, 30) if node == "node-1" else (local_ns, 20)

    j = FlowLatencyJoin(clocks=Clocks())
    j.add(flow("node-0", "tx", T0))
    r = j.add(flow("node-1", "rx", T0 + 6_000))
    assert r.latency_ns == 6_000 and r.corrected_latency_ns == 5_000 and r.error_bound_ns == 50
    assert r.clock_corrected


def coll(start: int, end: int, seq: int, rank: int = 0, source: str = "hook") -> CollectiveEvent:
    communicator = "fr:default" if source == "flight_recorder" else "world"
    return CollectiveEvent(node="node-0", ts_ns=end, job="j", rank=rank, communicator=communicator, op="allreduce",
                           seq=seq, bytes=100, start_ns=start, end_ns=end, source=source)


def it(i: int, start: int, end: int, rank: int = 0, collectives: int | None = None) -> IterationEvent:
    return IterationEvent(node="node-0", ts_ns=end, job="j", rank=rank, iteration=i, start_ns=start, end_ns=end,
                          collectives=collectives)


def test_breakdown_waits_for_collectives_then_merges_overlaps() -> None:
    agg = IterationBreakdownAggregator()
    assert agg.add_iteration(it(0, T0, T0 + 100)) == []          # collectives not seen yet
    assert agg.add_collective(coll(T0 + 60, T0 + 80, 1)) == []    # watermark 80 < 100
    out = agg.add_collective(coll(T0 + 70, T0 + 100, 2))          # overlaps: union is 60..100
    assert len(out) == 1
    b = out[0]
    assert (b.duration_ns, b.comm_ns, b.compute_ns, b.collectives, b.comm_bytes) == (100, 40, 60, 2, 200)
    # the next iteration's collectives arrived first: still counted only for their own iteration
    agg.add_collective(coll(T0 + 150, T0 + 190, 3))
    out = agg.add_iteration(it(1, T0 + 100, T0 + 190))
    assert out[0].comm_ns == 40 and out[0].collectives == 1


def test_breakdown_gives_up_waiting_after_grace() -> None:
    agg = IterationBreakdownAggregator(grace=2)
    assert agg.add_iteration(it(0, T0, T0 + 100)) == []
    assert agg.add_iteration(it(1, T0 + 100, T0 + 200)) == []
    out = agg.add_iteration(it(2, T0 + 200, T0 + 300))
    assert [b.iteration for b in out] == [0] and out[0].comm_ns == 0


def test_breakdown_emits_the_last_iteration_once_its_collectives_are_in() -> None:
    """The job's last iteration has no later collective to push the watermark past its end (issue 9 item 2)."""
    agg = IterationBreakdownAggregator()
    out = agg.add_collective(coll(T0 + 60, T0 + 80, 0)) + agg.add_collective(coll(T0 + 80, T0 + 95, 1))
    out += agg.add_iteration(it(0, T0, T0 + 100, collectives=2))   # the job ends here: nothing comes after
    assert [(b.iteration, b.collectives, b.comm_ns) for b in out] == [(0, 2, 35)]
    # iteration first: it waits until it holds the 2 collectives it launched, then closes at once
    assert agg.add_iteration(it(1, T0 + 100, T0 + 200, collectives=2)) == []
    assert agg.add_collective(coll(T0 + 150, T0 + 170, 2)) == []
    assert agg.add_collective(coll(T0 + 150, T0 + 170, 2)) == []                 # redelivered: counted once
    out = agg.add_collective(coll(T0 + 170, T0 + 190, 3))
    assert [(b.iteration, b.collectives, b.comm_bytes) for b in out] == [(1, 2, 200)]
    # an iteration that launched none closes at once
    assert [b.iteration for b in agg.add_iteration(it(2, T0 + 200, T0 + 300, collectives=0))] == [2]


def test_breakdown_waits_longer_for_counted_collectives_but_not_forever() -> None:
    agg = IterationBreakdownAggregator(grace=2, max_pending=4)
    out = [b for i in range(4) for b in agg.add_iteration(it(i, T0 + 100 * i, T0 + 100 * i + 90, collectives=1))]
    assert out == []                                        # 3 waiting behind iteration 0: its collective may come
    out = agg.add_iteration(it(4, T0 + 400, T0 + 490, collectives=1))
    assert [(b.iteration, b.collectives) for b in out] == [(0, 0)]     # lost: emitted without it


def test_breakdown_counts_each_collective_once_with_the_flight_recorder_on() -> None:
    """The flight recorder reports the hook's all-reduces again (issue 9 item 8): only hook rows count."""
    agg = IterationBreakdownAggregator()
    agg.add_collective(coll(T0 + 60, T0 + 80, 0))
    agg.add_collective(coll(T0 + 60, T0 + 60, 1, source="flight_recorder"))     # the same all-reduce, from FR
    agg.add_collective(coll(T0 + 120, T0 + 120, 2, source="flight_recorder"))   # FR watermark: not the hook's
    assert agg.add_iteration(it(0, T0, T0 + 100)) == []
    out = agg.add_collective(coll(T0 + 100, T0 + 130, 1))
    assert [(b.iteration, b.collectives, b.comm_bytes, b.comm_ns) for b in out] == [(0, 1, 100, 20)]


def test_a_redelivered_iteration_never_replaces_its_row() -> None:
    """A redelivered iteration came out again as (0, 0, 0) after its collectives were pruned: dropped and counted."""
    agg = IterationBreakdownAggregator()
    agg.add_collective(coll(T0 + 100, T0 + 150, 0))
    out = agg.add_iteration(it(0, T0, T0 + 200, collectives=1))
    assert [(b.iteration, b.collectives, b.comm_ns) for b in out] == [(0, 1, 50)]
    assert agg.add_iteration(it(0, T0, T0 + 200, collectives=1)) == []          # Kafka redelivery, spool replay
    assert agg.add_collective(coll(T0 + 250, T0 + 260, 1)) == []                 # the next iteration's collective
    assert agg.late_iterations == 1


def test_a_duplicate_of_a_pending_iteration_gives_one_row() -> None:
    agg = IterationBreakdownAggregator()
    assert agg.add_iteration(it(0, T0, T0 + 200, collectives=1)) == []
    assert agg.add_iteration(it(0, T0, T0 + 200, collectives=1)) == []
    out = agg.add_collective(coll(T0 + 100, T0 + 150, 0))
    assert [(b.iteration, b.collectives, b.comm_ns) for b in out] == [(0, 1, 50)]
    assert agg.duplicate_iterations == 1


def test_an_iteration_arriving_after_a_later_one_is_dropped_not_emitted_empty() -> None:
    agg = IterationBreakdownAggregator()
    agg.add_collective(coll(T0 + 100, T0 + 150, 0))                             # iteration 0's collective
    agg.add_collective(coll(T0 + 300, T0 + 350, 1))
    out = agg.add_iteration(it(1, T0 + 200, T0 + 400, collectives=1))          # 1 before 0
    assert [(b.iteration, b.collectives) for b in out] == [(1, 1)]
    assert agg.add_iteration(it(0, T0, T0 + 200, collectives=1)) == []          # its collective is gone
    assert agg.late_iterations == 1


def test_collectives_without_iterations_are_bounded() -> None:
    """A script that instruments DDP but never marks iterations: a rank holds at most max_collectives."""
    agg = IterationBreakdownAggregator(max_collectives=64)
    for s in range(1000):
        agg.add_collective(coll(T0 + 10 * s, T0 + 10 * s + 5, s))
    held = agg.ranks[("j", 0)].collectives
    assert len(held) <= 64 and agg.dropped_collectives == 1000 - len(held)
    assert min(c.seq for c in held.values()) == 1000 - len(held)                # the oldest were dropped
    out = agg.add_iteration(it(999, T0 + 9990, T0 + 9996, collectives=1))
    assert [(b.iteration, b.collectives) for b in out] == [(999, 1)]


def test_ranks_are_bounded_and_an_evicted_rank_emits_what_it_held() -> None:
    agg = IterationBreakdownAggregator(max_ranks=2)
    assert agg.add_iteration(it(0, T0, T0 + 100, rank=0, collectives=1)) == []
    agg.add_collective(coll(T0 + 10, T0 + 20, 0, rank=1))
    agg.add_collective(coll(T0 + 10, T0 + 20, 0, rank=1))                      # rank 1 most recently active
    out = agg.add_collective(coll(T0 + 10, T0 + 20, 0, rank=2))                # evicts rank 0
    assert [(b.rank, b.iteration, b.collectives) for b in out] == [(0, 0, 0)]
    assert sorted(agg.ranks) == [("j", 1), ("j", 2)] and agg.evicted_ranks == 1


def test_every_simulated_iteration_gets_a_breakdown_in_either_topic_order() -> None:
    """The demo lost each rank's last iteration: N iterations must give N breakdowns."""
    from clocktower.producers.simulator import FleetSimulator, SimConfig
    from clocktower.schemas.analytics import IterationBreakdown
    from clocktower.streams.processors import Processors

    sim = FleetSimulator(SimConfig(nodes=2, duration_s=3, seed=5))
    events = sim.advance(sim.now_ns + 3 * S)
    its = [e for e in events if isinstance(e, IterationEvent)]
    cols = [e for e in events if isinstance(e, CollectiveEvent)]
    assert len({e.rank for e in its}) > 1 and all(e.collectives for e in its)
    for order in (events, its + cols, cols + its):
        out = [e for e in Processors(KEY).on_batch(order) if isinstance(e, IterationBreakdown)]
        assert sorted((b.rank, b.iteration) for b in out) == sorted((i.rank, i.iteration) for i in its)
        assert all(b.collectives == i.collectives for b, i in zip(sorted(out, key=_rank_it), sorted(its, key=_rank_it),
                                                                  strict=True))


def _rank_it(e: IterationEvent | object) -> tuple[int, int]:
    return e.rank, e.iteration  # type: ignore[attr-defined]


def test_old_flight_recorder_records_decode_with_their_source() -> None:
    old = {"node": "n", "ts_ns": T0, "job": "j", "rank": 0, "op": "allreduce", "seq": 1, "bytes": 8,
           "start_ns": T0, "end_ns": T0}
    assert CollectiveEvent(**old, communicator="fr:default").source == "flight_recorder"
    assert CollectiveEvent(**old, communicator="default").source == "hook"
    assert IterationEvent(node="n", ts_ns=T0, job="j", rank=0, iteration=0, start_ns=T0, end_ns=T0).collectives is None


def link(ts: int, up: bool, changes: int, iface: str = "eth0") -> LinkState:
    return LinkState(node="node-1", ts_ns=ts, interface=iface, kind="ethernet", up=up, carrier_changes=changes,
                     speed_mbps=0, operstate="up" if up else "down", carrier=up)


def test_link_flap_opens_fails_over_then_restores() -> None:
    det = LinkFlapDetector(window_ns=10 * S, min_transitions=3, stable_ns=5 * S)
    assert det.on_link_state(link(T0, True, 0)) == []
    assert det.on_link_state(link(T0 + S, False, 1)) == []
    assert det.on_link_state(link(T0 + 2 * S, True, 2)) == []
    out = det.on_link_state(link(T0 + 3 * S, False, 3))
    inc, cmd = out
    assert isinstance(inc, Incident) and inc.kind == "link_flap" and inc.state == "open"
    assert isinstance(cmd, CommandIntent) and cmd.action == "failover" and cmd.node == "node-1"
    assert cmd.params == {"from": "eth0", "to": "eth1"} and cmd.incident_id == inc.incident_id
    assert det.on_link_state(link(T0 + 4 * S, True, 4)) == []      # still unstable
    assert det.on_link_state(link(T0 + 8 * S, True, 4)) == []      # up 4 s: not yet stable
    inc2, cmd2 = det.on_link_state(link(T0 + 9 * S, True, 4))
    assert inc2.state == "resolve" and inc2.incident_id == inc.incident_id
    assert cmd2.action == "restore" and cmd2.target == "eth0" and cmd2.incident_id == inc.incident_id


def test_slow_carrier_changes_are_not_a_flap() -> None:
    det = LinkFlapDetector(window_ns=10 * S, min_transitions=3)
    det.on_link_state(link(T0, True, 0))
    for i in range(1, 6):
        assert det.on_link_state(link(T0 + i * 11 * S, i % 2 == 0, i)) == []


def test_counter_jump_between_reports_counts_every_change() -> None:
    det = LinkFlapDetector(min_transitions=3)
    det.on_link_state(link(T0, True, 10))
    out = det.on_link_state(link(T0 + S, True, 14))   # 4 changes happened between two reports
    assert out and out[0].kind == "link_flap"


def gpu(ts: int, **kw) -> GpuHealth:
    return GpuHealth(node="node-3", ts_ns=ts, gpu=5, uuid="GPU-x", **{**GPU_READINGS, **kw})


def test_gpu_detector_xid79_drains_and_brings_a_spare_once() -> None:
    det = GpuFaultDetector()
    assert det.on_gpu_health(gpu(T0, temperature_c=60)) == []
    out = det.on_gpu_health(gpu(T0 + S, xid=79))
    kinds = [(type(e).__name__, getattr(e, "kind", None), getattr(e, "action", None)) for e in out]
    assert kinds == [("Incident", "gpu_xid", None), ("CommandIntent", None, "drain"),
                     ("CommandIntent", None, "spare")]
    assert all(c.incident_id == out[0].incident_id for c in out[1:])
    assert det.on_gpu_health(gpu(T0 + 2 * S, lost=True)) == []     # same failure: no second drain


def test_gpu_detector_ecc_and_thermal() -> None:
    det = GpuFaultDetector()
    det.on_gpu_health(gpu(T0))
    (ecc,) = det.on_gpu_health(gpu(T0 + S, ecc_uncorrected=1))
    assert ecc.kind == "gpu_ecc"
    assert det.on_gpu_health(gpu(T0 + 2 * S, ecc_uncorrected=1)) == []
    (hot,) = det.on_gpu_health(gpu(T0 + 3 * S, ecc_uncorrected=1, throttle_reasons=0x40, temperature_c=93))
    assert hot.kind == "gpu_thermal" and hot.state == "open"
    assert det.on_gpu_health(gpu(T0 + 4 * S, ecc_uncorrected=1, throttle_reasons=0x60)) == []
    (cool,) = det.on_gpu_health(gpu(T0 + 5 * S, ecc_uncorrected=1))
    assert cool.state == "resolve" and cool.incident_id == hot.incident_id


def test_an_evicted_rank_that_comes_back_still_drops_what_it_emitted() -> None:
    """A redelivered iteration of an evicted rank would come out again with no collectives (they were pruned)
    and replace the right row."""
    agg = IterationBreakdownAggregator(max_ranks=1)
    agg.add_collective(coll(T0 + 10, T0 + 20, 0, rank=0))
    first = agg.add_iteration(it(0, T0, T0 + 100, rank=0, collectives=1))
    assert [(b.iteration, b.collectives) for b in first] == [(0, 1)]
    assert agg.add_iteration(it(5, T0, T0 + 100, rank=1)) == []              # evicts rank 0
    out = agg.add_iteration(it(0, T0, T0 + 100, rank=0, collectives=1))       # rank 0 back: a redelivery
    out += agg.add_iteration(it(0, T0, T0 + 100, rank=0, collectives=1))
    assert [(b.rank, b.iteration) for b in out] == [(1, 5)], "only rank 1's pending iteration, from its eviction"
    assert agg.late_iterations == 2 and agg.evicted_ranks == 2
