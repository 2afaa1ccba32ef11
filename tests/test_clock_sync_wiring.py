"""The stream processors' clock sync on the simulator's probes: estimates and corrected flow latency.

Pure (no broker): simulated telemetry goes through `Processors.on_batch` in quarter-second steps, as the
Faust app feeds it, and every output is checked against the simulator's ground-truth clocks.
"""

from __future__ import annotations

from clocktower.producers.simulator.config import SimConfig
from clocktower.producers.simulator.fleet import FleetSimulator
from clocktower.schemas.analytics import ClockEstimate, FlowLatency
from clocktower.streams.processors import Processors
from tests.control_keys import TEST_SIGNER

S = 1_000_000_000
UPDATE_NS = 250_000_000
# The fitters publish once per 250 ms grid step of probe time crossed. A start on the grid put each step's end
# within a node's clock offset (up to 2 ms) of a grid line, so half the steps crossed two lines and the next none
# (41 estimate times of 80 for about 1 start in 30): the start is fixed, half-way between two grid lines.
START_NS = 1_796_513_619_750_000_000 + UPDATE_NS // 2


def _run(seconds: int) -> tuple[FleetSimulator, list[ClockEstimate], list[FlowLatency]]:
    sim = FleetSimulator(SimConfig(nodes=4, duration_s=seconds), start_ns=START_NS)   # faults on: congestion too
    processors = Processors(TEST_SIGNER)
    estimates: list[ClockEstimate] = []
    flows: list[FlowLatency] = []
    for step in range(1, 4 * seconds + 1):
        for e in processors.on_batch(sim.advance(sim.start_ns + step * S // 4)):
            if isinstance(e, ClockEstimate):
                estimates.append(e)
            elif isinstance(e, FlowLatency):
                flows.append(e)
    return sim, estimates, flows


def test_estimates_and_corrected_latency_match_ground_truth() -> None:
    sim, estimates, flows = _run(20)
    # one solve per 250 ms step of probe time the watermark crosses, at the watermark (the oldest edge's latest
    # fit, whose origin moves with the fitters' node clocks: the gaps alternate about 200 and 300 ms), each for
    # all 4 nodes against one reference, as the Faust app solves
    times = sorted({e.ts_ns for e in estimates})
    assert len(times) >= 60
    assert all(150_000_000 <= b - a <= 400_000_000 for a, b in zip(times, times[1:], strict=False))
    assert {e.reference for e in estimates} == {"node-0.demo"}
    assert {e.node for e in estimates if e.ts_ns == times[-1]} == set(sim.clocks)
    ref = sim.clocks["node-0.demo"]
    errors = []
    for e in estimates:
        t = ref.to_true(e.ts_ns)
        truth = sim.clocks[e.node].offset_ns(t) - ref.offset_ns(t)
        errors.append(abs(e.offset_ns - truth))
        assert errors[-1] <= e.error_bound_ns + 1, e
    assert sorted(errors)[int(0.99 * len(errors))] < 100      # raw offsets are up to ms apart

    # the join says so when no estimate exists yet, then corrects within its stated bound
    first = min(f.rx_ns for f in flows if f.clock_corrected)
    early = [f for f in flows if not f.clock_corrected]
    assert early and all(f.corrected_latency_ns is None and f.error_bound_ns is None for f in early)
    assert all(f.rx_ns <= first + 5 * S for f in early)
    corrected = [f for f in flows if f.clock_corrected]
    assert len(corrected) > 0.8 * len(flows)
    for f in corrected:
        true_delay = sim.clocks[f.node].to_true(f.rx_ns) - sim.clocks[f.src_node].to_true(f.tx_ns)
        assert abs(f.corrected_latency_ns - true_delay) <= f.error_bound_ns + 2, f
        assert f.error_bound_ns < 1_000
    raw_error = sorted(abs(f.latency_ns - (sim.clocks[f.node].to_true(f.rx_ns)
                                           - sim.clocks[f.src_node].to_true(f.tx_ns))) for f in corrected)
    assert raw_error[len(raw_error) // 2] > 10_000     # without correction the ms offsets swamp the delay


def test_one_node_with_a_clock_an_hour_ahead_does_not_stop_the_others() -> None:
    """Probe time follows most receivers, not the fastest: a rogue receiver an hour ahead changes nothing."""
    from clocktower.schemas.telemetry import ClockProbe

    sim = FleetSimulator(SimConfig(nodes=4, duration_s=10, faults=False), start_ns=START_NS)
    processors = Processors(TEST_SIGNER)
    steps_with_estimates = []
    for step in range(1, 41):
        events = sim.advance(sim.start_ns + step * S // 4)
        if step == 12:
            t = events[-1].ts_ns
            events.append(ClockProbe(node="rogue", ts_ns=t + 3600 * S, pair_id=1, idx=0, sender="node-0.demo",
                                     receiver="rogue", tx_ns=t, rx_ns=t + 3600 * S))
        out = processors.on_batch(events)
        if step > 12:
            steps_with_estimates.append({e.node for e in out if isinstance(e, ClockEstimate)} >= set(sim.clocks))
    assert processors.probe_time_ns < sim.start_ns + 3600 * S
    assert sum(steps_with_estimates) >= len(steps_with_estimates) - 1      # every step still estimates all 4
