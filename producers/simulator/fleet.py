"""The fleet simulator: N nodes x G GPUs training one job, with faults injected.

`advance(to)` moves simulated true time forward and returns every event whose
true emission time falls in (previous time, to], across all schemas and nodes,
in true-time order. Each producer (training job with its flows, GPUs, links,
clock probes) has its own random generator and plans whole units (an
iteration, a reporting period) ahead; events planned past `to` wait for a
later call. The output therefore does not depend on how time is sliced.

Ground truth is available up front: `faults` (InjectedFault events, true
times) and `clocks` (each node's true offset and drift at any true time).
Every timestamp inside the events is on the reporting node's own clock.
"""

from __future__ import annotations

import random
import time
from bisect import bisect_right
from collections import Counter
from operator import itemgetter

from clocktower.producers.simulator.config import SimConfig, check_nodes
from clocktower.producers.simulator.fault_schedule import FaultSchedule
from clocktower.producers.simulator.flows import Planned, RingFlows
from clocktower.producers.simulator.gpus import GpuMonitor
from clocktower.producers.simulator.heartbeats import HeartbeatPlanner
from clocktower.producers.simulator.links import LinkMonitor
from clocktower.producers.simulator.node_clock import NodeClock
from clocktower.producers.simulator.probes import ClockProber
from clocktower.producers.simulator.topology import Topology
from clocktower.producers.simulator.training import TrainingJob
from clocktower.schemas.event import Event
from clocktower.schemas.operations import InjectedFault

MAX_OFFSET_NS = 2_000_000
MAX_DRIFT_PPM = 30.0
_first = itemgetter(0)


class FleetSimulator:
    """Simulated telemetry of a training fleet, advanced in true time."""

    def __init__(self, config: SimConfig, start_ns: int | None = None) -> None:
        check_nodes(config.nodes)
        self.config = config
        self.start_ns = time.time_ns() if start_ns is None else start_ns
        self._now = self.start_ns
        self.topology = topo = Topology(config.nodes, config.gpus_per_node)
        seed = config.seed

        def rng(name: str) -> random.Random:
            return random.Random(f"{seed}:{name}")

        clock_rng = rng("clocks")
        self.clocks: dict[str, NodeClock] = {}
        for node in topo.node_ids:
            offset = clock_rng.uniform(-MAX_OFFSET_NS, MAX_OFFSET_NS)
            drift = clock_rng.uniform(-MAX_DRIFT_PPM, MAX_DRIFT_PPM)
            self.clocks[node] = NodeClock(node, self.start_ns, offset, drift, max_drift_ppm=MAX_DRIFT_PPM,
                                          seed=seed)
        clocks = [self.clocks[n] for n in topo.node_ids]
        self.schedule = FaultSchedule(config, topo, self.start_ns)
        self.faults: list[InjectedFault] = list(self.schedule.faults)

        link_bytes = config.bucket_bytes * 2 * (config.nodes - 1) // config.nodes
        flows = RingFlows(topo, clocks, self.schedule, config.segments_per_bucket, link_bytes, rng("flows"))
        faults, start = self.schedule, self.start_ns
        self.training = TrainingJob(config, topo, clocks, faults, start, rng("training"), flows)
        self.gpus = GpuMonitor(config, topo, clocks, faults, self.training, start, rng("gpus"))
        self.links = LinkMonitor(config, topo, clocks, faults, start, rng("links"))
        self.probes = ClockProber(config, topo, clocks, faults, start, rng("probes"))
        self.heartbeats = HeartbeatPlanner(config, topo, clocks, start, rng("heartbeats"))
        self.counts: Counter[str] = Counter()
        self._pending: Planned = []

    @property
    def now_ns(self) -> int:
        """Current simulated true time (ns since the epoch)."""
        return self._now

    def advance(self, to_true_ns: int) -> list[Event]:
        """Every event with true emission time in (now, to_true_ns], oldest first; now becomes to_true_ns."""
        if to_true_ns <= self._now:
            return []
        pending = self._pending
        # Training runs a little ahead, so GPU readings know whether their rank is computing.
        self.training.plan(to_true_ns + 2 * self.gpus.period, pending)
        self.gpus.plan(to_true_ns, pending)
        self.links.plan(to_true_ns, pending)
        self.probes.plan(to_true_ns, pending)
        self.heartbeats.plan(to_true_ns, pending)
        self.training.forget_before(to_true_ns)

        pending.sort(key=_first)   # stable; mostly sorted already
        cut = bisect_right(pending, to_true_ns, key=_first)
        silent = self.schedule.silent_between(self._now, to_true_ns)
        events = ([e for t, e in pending[:cut] if not (e.node in silent and silent[e.node].active(t))] if silent
                  else [e for _, e in pending[:cut]])
        del pending[:cut]
        self._now = to_true_ns
        for model, n in Counter(map(type, events)).items():
            self.counts[model.SCHEMA] += n
        return events
