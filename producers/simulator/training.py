"""The data-parallel training job: iterations, all-reduce buckets, and their flows.

Synchronous data parallelism over every rank of the fleet. Each iteration,
every rank computes (~iteration_compute_ms, a few % noise, slower while a
thermal or straggler fault hits it), then all-reduces its gradient in
`buckets` buckets over the ring. A bucket completes on every rank at the same
time, once the slowest rank has joined, so a slow rank shows up as a long
first-bucket wait on all the others. Each rank reports one CollectiveEvent per
bucket and one IterationEvent (with its bucket count, so the stream's breakdown
closes it once those are in), stamped on its node's clock, emitted at their
end. The job keeps running when a GPU is lost; the simulator only reports.
"""

from __future__ import annotations

import random
from bisect import bisect_right

from clocktower.producers.event_builder import EventBuilder
from clocktower.producers.simulator.config import SimConfig
from clocktower.producers.simulator.fault_schedule import FaultSchedule
from clocktower.producers.simulator.flows import Planned, RingFlows
from clocktower.producers.simulator.node_clock import NodeClock
from clocktower.producers.simulator.topology import COMMUNICATOR, JOB_ID, PRIMARY, Topology
from clocktower.schemas.telemetry import CollectiveEvent, IterationEvent

MS = 1_000_000
COMPUTE_NOISE = 0.02          # relative std of a rank's compute time
COMM_MS_PER_64MIB = 12.0      # one bucket of 64 MiB on a 4-node ring, healthy links
COMM_NOISE = 0.03
CONGESTION_COMM_FACTOR = 1.6  # a congested ring link: ~19 ms per bucket instead of ~12
FAILOVER_COMM_FACTOR = 1.15   # while a ring node's eth0 is down and traffic rides eth1
START_JITTER_NS = 30_000
END_JITTER_NS = 20_000
LAUNCH_NS = (2_000, 6_000)
STEP_GAP_NS = 300_000         # optimizer step and data loading between iterations


class TrainingJob:
    """Plans whole iterations ahead and hands out their events with true emission times."""

    def __init__(self, config: SimConfig, topo: Topology, clocks: list[NodeClock], faults: FaultSchedule,
                 start_ns: int, rng: random.Random, flows: RingFlows) -> None:
        self.topo = topo
        self.clocks = clocks
        self.faults = faults
        self.rng = rng
        self.flows = flows
        self.buckets = config.buckets
        self.bucket_bytes = config.bucket_bytes
        self.compute_ns = config.iteration_compute_ms * MS
        ring_share = 2 * (topo.nodes - 1) / topo.nodes / 1.5   # relative to 4 nodes
        self.comm_ns = COMM_MS_PER_64MIB * MS * config.bucket_bytes / 2**26 * ring_share
        self.iteration = 0
        self.next_start = start_ns + MS
        self._seq = [0] * topo.ranks
        self._flapping = [n for n in range(topo.nodes) if faults.flapping(n)]
        self._collective = EventBuilder(CollectiveEvent)
        self._iteration = EventBuilder(IterationEvent)
        # Compute windows of planned iterations, for GPU utilisation: starts and per-rank compute ends.
        self._win_starts: list[int] = []
        self._win_ends: list[list[int]] = []

    def plan(self, until: int, out: Planned) -> None:
        """Plan every iteration that starts at or before true time `until`."""
        while self.next_start <= until:
            self._plan_iteration(out)

    def computing(self, rank: int, t: int) -> bool:
        """Whether `rank` is in its compute phase at true time `t` (within planned iterations)."""
        i = bisect_right(self._win_starts, t) - 1
        return i >= 0 and t < self._win_ends[i][rank]

    def forget_before(self, t: int) -> None:
        """Drop compute windows that ended before `t` (keeping the one that contains it)."""
        i = bisect_right(self._win_starts, t) - 1
        if i > 0:
            del self._win_starts[:i]
            del self._win_ends[:i]

    def _plan_iteration(self, out: Planned) -> None:
        topo, rng, faults, clocks = self.topo, self.rng, self.faults, self.clocks
        g_count = topo.gpus_per_node
        ranks = range(topo.ranks)
        t0 = self.next_start
        rand, gauss = rng.random, rng.gauss
        starts = [t0 + int(rand() * START_JITTER_NS) for _ in ranks]
        ends = [s + int(self.compute_ns * max(0.5, 1.0 + gauss(0.0, COMPUTE_NOISE))
                        * faults.compute_factor(r, t0)) for r, s in zip(ranks, starts, strict=True)]
        self._win_starts.append(t0)
        self._win_ends.append(ends)

        comm_factor = 1.0
        if faults.any_congested(t0):
            comm_factor *= CONGESTION_COMM_FACTOR

        global_end = max(ends)          # every rank waits for the slowest one
        prev_end = list(ends)           # per rank: when its previous step finished
        build = self._collective
        seqs = self._seq
        for _ in range(self.buckets):
            f = comm_factor
            if not all(faults.link_up(n, PRIMARY, global_end) for n in self._flapping):
                f *= FAILOVER_COMM_FACTOR
            w0 = global_end
            global_end = w0 + int(self.comm_ns * f * max(0.5, 1.0 + gauss(0.0, COMM_NOISE)))
            self.flows.bucket(w0, global_end, out)
            for r in ranks:
                start = prev_end[r] + LAUNCH_NS[0] + int(rand() * (LAUNCH_NS[1] - LAUNCH_NS[0]))
                end = max(global_end, start) + int(rand() * END_JITTER_NS)
                prev_end[r] = end
                clock = clocks[r // g_count]
                end_local = clock.stamp(end, rng)
                out.append((end, build(
                    node=topo.node_ids[r // g_count], ts_ns=end_local, job=JOB_ID, rank=r,
                    communicator=COMMUNICATOR, op="allreduce", seq=seqs[r], bytes=self.bucket_bytes,
                    start_ns=clock.stamp(start, rng), end_ns=end_local)))
                seqs[r] += 1

        it = self.iteration
        build_it = self._iteration
        for r in ranks:
            clock = clocks[r // g_count]
            end = prev_end[r] + LAUNCH_NS[0]
            end_local = clock.stamp(end, rng)
            out.append((end, build_it(node=topo.node_ids[r // g_count], ts_ns=end_local, job=JOB_ID, rank=r,
                                      iteration=it, start_ns=clock.stamp(starts[r], rng), end_ns=end_local,
                                      collectives=self.buckets, gpu=r % g_count,
                                      world_size=topo.ranks)))
        self.iteration += 1
        self.next_start = max(prev_end) + STEP_GAP_NS
