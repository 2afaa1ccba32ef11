"""How well the detectors find what the simulator injects: precision, recall and latency per fault kind.

Runs `--schedules` randomized fault schedules (SimConfig schedule="random": every kind once, in random order,
targets and strengths, after a fault-free warm-up) and `--fault-free` runs with no fault but the background
noise a healthy fleet shows (temperature swings, power-cap episodes, correctable ECC counts, 2 % iteration
jitter). Each run goes through every registered stream processor in one process (streams/processors.py: the
logic the Faust workers run, without the broker), fed in 100 ms steps of simulated time with the worker's clock
following the simulation. Incidents are scored against the ground truth (clocktower/detection_score.py).

Everything the simulator emits is fed: flows and clock probes too, since congestion is judged on the
clock-corrected one-way delay that the flow join and clock sync make of them.

Prints one JSON object: per kind `precision`, `recall`, `latency_ms_p50`, `latency_ms_p95` (and counts);
`fault_free_incidents`; overall `precision`, `recall`, `latency_ms_p50`; `cpu_us_per_event` of the processors.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # tests.control_keys: a throwaway signing key

from clocktower.detection_score import Scorer  # noqa: E402
from clocktower.producers.simulator.config import SimConfig  # noqa: E402
from clocktower.producers.simulator.fleet import FleetSimulator  # noqa: E402
from clocktower.schemas.analytics import Incident  # noqa: E402
from clocktower.streams.processors import Processors  # noqa: E402
from tests.control_keys import TEST_SIGNER  # noqa: E402

STEP_NS = 100_000_000
START_NS = 1_780_000_000 * 10**9


def run_one(config: SimConfig) -> tuple[FleetSimulator, list[Incident], int, float]:
    """One simulated run through the processors: the simulator, its incidents, events fed, processor CPU s."""
    sim = FleetSimulator(config, start_ns=START_NS)
    processors = Processors(TEST_SIGNER, clock_ns=lambda: sim.now_ns, known_after_ns=0)
    incidents: list[Incident] = []
    fed, cpu = 0, 0.0
    for step in range(round(config.duration_s * 1e9 / STEP_NS)):
        events = sim.advance(sim.start_ns + (step + 1) * STEP_NS)
        fed += len(events)
        t = time.process_time()
        out = processors.on_batch(events)
        cpu += time.process_time() - t
        incidents += [e for e in out if isinstance(e, Incident)]
    return sim, incidents, fed, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--schedules", type=int, default=20, help="randomized fault schedules (default 20)")
    ap.add_argument("--fault-free", type=int, default=5, help="runs with no fault, only background noise")
    ap.add_argument("--duration", type=float, default=40.0, help="simulated seconds per run (default 40)")
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0, help="the first run's seed; run i uses seed + i")
    ap.add_argument("--quick", action="store_true", help="2 schedules and 1 fault-free run of 30 s (a smoke test)")
    ap.add_argument("--progress", action="store_true", help="a line on stderr per run")
    args = ap.parse_args()
    if args.quick:
        args.schedules, args.fault_free, args.duration = 2, 1, 30.0
    if args.schedules < 0 or args.fault_free < 0 or args.schedules + args.fault_free == 0:
        ap.error("--schedules and --fault-free must be >= 0, and not both 0")
    scorer = Scorer()
    events = 0
    cpu = 0.0
    wall = time.monotonic()
    runs = [(True, i) for i in range(args.schedules)] + [(False, i) for i in range(args.fault_free)]
    for n, (faulty, i) in enumerate(runs, 1):
        config = SimConfig(nodes=args.nodes, duration_s=args.duration, seed=args.seed + i + (0 if faulty else 10_000),
                           schedule="random", faults=faulty)
        sim, incidents, fed, used = run_one(config)
        events += fed
        cpu += used
        scorer.add_run(sim.faults, incidents, lambda node, ns, sim=sim: sim.clocks[node].to_true(ns))
        if args.progress:
            print(f"run {n}/{len(runs)} ({'faults' if faulty else 'fault-free'}, seed {config.seed}): "
                  f"{len(incidents)} incident rows", file=sys.stderr, flush=True)
    report = scorer.report()
    report.update(schedules=args.schedules, duration_s=args.duration, nodes=args.nodes, events=events,
                  cpu_us_per_event=round(cpu / events * 1e6, 2) if events else None,
                  wall_s=round(time.monotonic() - wall, 1))
    print(json.dumps(report))


if __name__ == "__main__":
    main()
