"""A joined flow segment waits for the clock estimates that follow its timestamps, within a bound on either clock."""

from __future__ import annotations

import time

from clocktower.schemas.analytics import ClockEstimate, FlowLatency
from clocktower.streams.clocksync.clock_view import ClockView
from clocktower.streams.joins.flow_latency import FlowLatencyJoin
from clocktower.streams.processor_runner import ProcessorRunner
from clocktower.streams.processors import Processors
from clocktower.streams.state_store import StateStore
from tests.control_keys import TEST_SIGNER
from tests.test_flow_latency_join import T0, S, _run, flow

OFFSET = 1_000   # node-1's clock is 1 us ahead of node-0's (the reference)


class Clocks:
    """Estimates known up to `covered_ns` of reference time; node-1 runs OFFSET ahead."""

    def __init__(self) -> None:
        self.covered_ns = 0

    def _ref(self, node: str, local_ns: int) -> int:
        return local_ns - (OFFSET if node == "node-1" else 0)

    def to_reference(self, node: str, local_ns: int) -> tuple[int, int] | None:
        return (self._ref(node, local_ns), 10) if self.covered_ns else None

    def awaits(self, node: str, local_ns: int) -> bool:
        return self._ref(node, local_ns) > self.covered_ns


class Wall:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _join(clocks: Clocks, wall: Wall | None = None) -> FlowLatencyJoin:
    return FlowLatencyJoin(clocks, wait_ns=3 * S, wall=wall or Wall())


def test_a_segment_waits_for_the_estimate_after_it_then_is_corrected() -> None:
    clocks = Clocks()
    join = _join(clocks)
    r = ProcessorRunner(join)
    assert _run(r, flow("node-0", "tx", T0), flow("node-1", "rx", T0 + 6_000)) == []
    assert join.due_partitions() == [0] and join.held == 1
    assert r.run(0, []) == []                          # a tick with the estimates still behind: it waits on
    clocks.covered_ns = T0 + 5_000 - 1                 # an estimate, but one just before the rx end
    assert r.run(0, []) == []
    clocks.covered_ns = T0 + 5_000
    [lat] = r.run(0, [])
    assert isinstance(lat, FlowLatency) and lat.clock_corrected and lat.corrected_latency_ns == 5_000
    assert join.due_partitions() == [] and join.held_to_bound == 0
    assert _run(r, flow("node-1", "rx", T0 + 6_000)) == [lat]   # redelivered once published: the same row again


def test_a_duplicate_half_while_held_publishes_nothing_early() -> None:
    clocks = Clocks()
    r = ProcessorRunner(_join(clocks))
    _run(r, flow("node-0", "tx", T0), flow("node-1", "rx", T0 + 6_000))
    assert _run(r, flow("node-1", "rx", T0 + 6_000), flow("node-0", "tx", T0)) == []


def test_the_wait_ends_on_the_workers_clock_and_is_counted() -> None:
    wall = Wall()
    join = _join(Clocks(), wall)
    r = ProcessorRunner(join)
    _run(r, flow("node-0", "tx", T0), flow("node-1", "rx", T0 + 6_000))
    wall.now += 2.9
    assert r.run(0, []) == []
    wall.now += 0.2
    [lat] = r.run(0, [])
    assert not lat.clock_corrected and lat.latency_ns == 6_000   # published as it is: no estimate came
    assert join.held_to_bound == 1 and join.counters()["held_to_bound"] == 1


def test_a_held_segment_survives_a_restart_and_its_new_owner_publishes_it_at_its_event_time_bound() -> None:
    backing: dict[bytes, bytes] = {}
    clocks = Clocks()
    first = ProcessorRunner(_join(clocks), StateStore(_join(clocks), backing))
    _run(first, flow("node-0", "tx", T0), flow("node-1", "rx", T0 + 6_000))
    owner = _join(clocks)
    restarted = ProcessorRunner(owner, StateStore(owner, backing))   # the same table, a new worker
    restarted.store.reload()
    clocks.covered_ns = T0 + 10 * S
    later = _run(restarted, flow("node-0", "tx", T0 + 4 * S, seq=2), flow("node-1", "tx", T0 + 4 * S, seq=3))
    [lat] = [x for x in later if x.seq == 1]                         # published once its estimates came
    assert lat.clock_corrected and lat.corrected_latency_ns == 5_000


def test_a_held_segment_recovered_from_the_table_is_ticked_even_when_no_record_comes() -> None:
    """Its partition may see no later record (the end of a run): the new owner's timer publishes it (measured:
    test_scale_out lost 48 rows of a killed worker's held segments before this)."""
    backing: dict[bytes, bytes] = {}
    clocks, wall = Clocks(), Wall()
    first = ProcessorRunner(_join(clocks), StateStore(_join(clocks), backing))
    clocks.covered_ns = T0
    done = _run(first, flow('"held":true', "tx", T0 - S, seq=3), flow("node-1", "rx", T0 - S, seq=3))
    assert len(done) == 1                                            # published at once: a name cannot fake "held"
    _run(first, flow("node-0", "tx", T0), flow("node-1", "rx", T0 + 6_000),           # held
         flow("node-2", "tx", T0, seq=2), flow("node-1", "rx", T0 + 6_000, seq=2))
    clocks.covered_ns = T0 + 10 * S
    owner = _join(clocks, wall)
    restarted = ProcessorRunner(owner, StateStore(owner, backing))
    restarted.store.reload()
    assert owner.due_partitions() == [0] and len(owner._held[0]) == 2
    out = restarted.run(0, [])
    assert sorted(x.seq for x in out) == [1, 2] and all(x.clock_corrected for x in out)
    assert owner.due_partitions() == []


def test_a_recovered_held_segment_whose_estimates_never_come_goes_out_at_the_bound() -> None:
    backing: dict[bytes, bytes] = {}
    clocks, wall = Clocks(), Wall()
    first = ProcessorRunner(_join(clocks), StateStore(_join(clocks), backing))
    _run(first, flow("node-0", "tx", T0), flow("node-1", "rx", T0 + 6_000))
    owner = _join(clocks, wall)
    restarted = ProcessorRunner(owner, StateStore(owner, backing))
    restarted.store.reload()
    wall.now += 2.9
    assert restarted.run(0, []) == []
    wall.now += 0.2
    [lat] = restarted.run(0, [])
    assert not lat.clock_corrected and owner.held_to_bound == 1


def test_revoked_partitions_are_no_longer_ticked() -> None:
    join = _join(Clocks())
    _run(ProcessorRunner(join), flow("node-0", "tx", T0), flow("node-1", "rx", T0 + 6_000))
    join.revoked()
    assert join.due_partitions() == []


def test_without_a_wait_or_clocks_a_segment_is_published_at_once() -> None:
    [a] = _run(ProcessorRunner(FlowLatencyJoin(Clocks(), wait_ns=0)), flow("node-0", "tx", T0),
               flow("node-1", "rx", T0 + 6_000))
    assert not a.clock_corrected


def test_clock_view_awaits_until_an_estimate_after_the_timestamp() -> None:
    view = ClockView()
    assert view.awaits("node-1", T0)                     # no estimate yet: the first solve may be on its way
    est = dict(reference="node-0", solve_nodes=2, drift_ppb=0.0, drift_std_ppb=0.0, error_bound_ns=5,
               offset_frac_ns=0.0)
    view.add_estimates([ClockEstimate(node=n, ts_ns=T0, offset_ns=OFFSET if n == "node-1" else 0, **est)
                        for n in ("node-0", "node-1")])
    assert not view.awaits("node-0", T0 + S)             # the reference converts to itself
    assert not view.awaits("node-1", T0 + OFFSET)        # covered: the estimate is at that instant
    assert view.awaits("node-1", T0 + OFFSET + 1)
    assert view.awaits("node-2", T0)                     # not in the latest solve


def test_the_in_memory_pipeline_ticks_held_segments_on_its_timer() -> None:
    procs = Processors(TEST_SIGNER, clock_wait_ns=1_000_000)   # 1 ms; no probes: no estimate comes
    out = procs.on_batch([flow("node-0", "tx", T0), flow("node-1", "rx", T0 + 6_000)])
    assert not [e for e in out if isinstance(e, FlowLatency)]
    time.sleep(0.01)
    [lat] = [e for e in procs.on_timer() if isinstance(e, FlowLatency)]
    assert lat.latency_ns == 6_000 and not lat.clock_corrected


def test_a_held_segment_whose_key_comes_round_again_is_published_not_lost() -> None:
    """A sender whose seq restarted reuses the key of a segment still held: that one goes out first."""
    clocks = Clocks()
    join = _join(clocks)
    r = ProcessorRunner(join)
    assert _run(r, flow("node-0", "tx", T0), flow("node-1", "rx", T0 + 6_000)) == []
    [old] = _run(r, flow("node-0", "tx", T0 + 2 * S))                  # the same key, another time: a new segment
    assert old.seq == 1 and old.tx_ns == T0 and join.reused_keys == 1 and join.due_partitions() == []


def test_a_held_segment_that_cannot_be_converted_does_not_take_the_others_rows_with_it() -> None:
    class Broken(Clocks):
        def to_reference(self, node: str, local_ns: int) -> tuple[int, int] | None:
            if local_ns == T0 + 7:
                raise ValueError("a bad estimate")
            return super().to_reference(node, local_ns)

    clocks = Broken()
    join = _join(clocks)
    r = ProcessorRunner(join)
    _run(r, flow("node-0", "tx", T0 + 7), flow("node-1", "rx", T0 + 6_000),
         flow("node-0", "tx", T0, seq=2), flow("node-1", "rx", T0 + 6_000, seq=2))
    clocks.covered_ns = T0 + 10 * S
    [good] = r.run(0, [])
    assert good.seq == 2 and good.clock_corrected and join.publish_errors == 1
    assert join.counters()["publish_errors"] == 1
