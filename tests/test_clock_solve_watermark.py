"""The fleet's clock solve waits for a fitter that runs behind instead of leaving its edges out."""

from __future__ import annotations

from clocktower.producers.simulator import FleetSimulator, SimConfig
from clocktower.schemas.telemetry import ClockProbe
from clocktower.streams.joins.clock_edges import ClockEdgeFits
from clocktower.streams.joins.clock_solve import ClockSolve
from clocktower.streams.processor import partition_of
from clocktower.streams.processor_runner import ProcessorRunner

S = 10**9


def _solves(lag_ticks: int, seconds: int = 12) -> list[tuple[float, int]]:
    """Probes split by edge over two fitters; the fits of the one with the cross edges (partition 0 with these
    names: without them the other's two triangles are two islands) reach the solve `lag_ticks` x 100 ms late."""
    sim = FleetSimulator(SimConfig(nodes=6, duration_s=seconds, seed=11), start_ns=1_796_000_000 * S)
    fitters = [ProcessorRunner(ClockEdgeFits()), ProcessorRunner(ClockEdgeFits())]
    solve = ProcessorRunner(ClockSolve())
    late: list[list] = []
    sizes: list[tuple[float, int]] = []   # (solve time in s after the start, nodes estimated)
    for tick in range(1, 10 * seconds + 1):
        probes = [e for e in sim.advance(sim.start_ns + tick * S // 10) if isinstance(e, ClockProbe)]
        fits = []
        for p, runner in enumerate(fitters):
            mine = [e for e in probes if partition_of(runner.processor.partition_key(e), 2) == p]
            out = runner.run(p, mine)
            if p == 1:
                fits += out
            else:
                late.append(out)
        if len(late) > lag_ticks:
            fits += late.pop(0)
        for fit in fits:          # one record at a time, as the solve's partition delivers them
            estimates = solve.run(0, [fit])
            if estimates:
                sizes.append(((estimates[0].ts_ns - sim.start_ns) / S, len(estimates)))
    return sizes


def test_a_fitter_three_seconds_behind_delays_the_solves_but_every_node_stays_in() -> None:
    on_time, behind = _solves(0), _solves(30)
    assert len(on_time) >= 40 and all(n == 6 for t, n in on_time if t >= 1.5), on_time
    # until the late fitter's first fits are in, only the other's edges exist; from then on, whole solves
    late = [n for t, n in behind if t >= 3.5]
    assert len(late) >= 20 and set(late) == {6}, behind


def test_a_fitter_that_comes_back_after_the_others_reached_the_end_still_gets_its_nodes_solved() -> None:
    """A worker killed before its fitter's first fits, restarted late: its fits (all of them, replayed) reach the
    solve only after the other fitter's last ones, so the watermark never crosses a new step again. Its nodes must
    still be solved once its edges have caught up (seen in test_scale_out's killed run: three nodes never got an
    estimate)."""
    seconds = 12
    sim = FleetSimulator(SimConfig(nodes=6, duration_s=seconds, seed=11), start_ns=1_796_000_000 * S)
    fitters = [ProcessorRunner(ClockEdgeFits()), ProcessorRunner(ClockEdgeFits())]
    solve = ProcessorRunner(ClockSolve())
    withheld: list = []
    solved: list[int] = []
    for tick in range(1, 10 * seconds + 1):
        probes = [e for e in sim.advance(sim.start_ns + tick * S // 10) if isinstance(e, ClockProbe)]
        for p, runner in enumerate(fitters):
            out = runner.run(p, [e for e in probes if partition_of(runner.processor.partition_key(e), 2) == p])
            if p == 0:
                withheld += out
            else:
                for fit in out:
                    solved += [len(est) for est in [solve.run(0, [fit])] if est]
    assert solved and max(solved) < 6                     # only the other fitter's edges so far
    after = [len(est) for fit in withheld for est in [solve.run(0, [fit])] if est]
    assert after and after[-1] == 6, after
