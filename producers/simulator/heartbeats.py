"""Every node agent's heartbeat, as the real agent sends it (producers/agent/heartbeat_source.py): one every
`heartbeat_s` with a fixed random phase per node, stamped on the node's clock, `seq` counting from 0. A node
that the fault schedule silences sends nothing at all (fleet.py drops its every event), heartbeats included."""

from __future__ import annotations

import random

from clocktower.producers.event_builder import EventBuilder
from clocktower.producers.simulator.config import SimConfig
from clocktower.producers.simulator.flows import Planned
from clocktower.producers.simulator.node_clock import NodeClock
from clocktower.producers.simulator.topology import Topology
from clocktower.schemas.telemetry import NodeHeartbeat


class HeartbeatPlanner:
    def __init__(self, config: SimConfig, topo: Topology, clocks: list[NodeClock], start_ns: int,
                 rng: random.Random) -> None:
        self.topo, self.clocks, self.rng = topo, clocks, rng
        self.period = round(config.heartbeat_s * 1e9)
        self.interval_ms = max(1, round(config.heartbeat_s * 1000))
        self.phases = [1 + int(rng.random() * (self.period - 1)) for _ in range(topo.nodes)]
        self.start_ns = start_ns
        self.slot = 0
        self._build = EventBuilder(NodeHeartbeat)

    def plan(self, until: int, out: Planned) -> None:
        """Plan every heartbeat period that begins at or before true time `until`."""
        while self.start_ns + self.slot * self.period <= until:
            base = self.start_ns + self.slot * self.period
            for n, node in enumerate(self.topo.node_ids):
                t = base + self.phases[n]
                out.append((t, self._build(node=node, ts_ns=self.clocks[n].stamp(t, self.rng), seq=self.slot,
                                           interval_ms=self.interval_ms)))
            self.slot += 1
