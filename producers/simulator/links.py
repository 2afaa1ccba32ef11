"""LinkState reports of every node's two ports: periodic, and on every change.

Each interface reports at `link_report_hz` with a fixed random phase per node,
and immediately when its carrier changes (the link_flap fault). The
`carrier_changes` counter is cumulative per interface, like the kernel's.
Each node's primary port names its backup (eth0 -> eth1, as an agent with
CLOCKTOWER_AGENT_LINK_BACKUPS=eth0=eth1 reports it), so the streams can fail
over to it and back; the backup port has none.
"""

from __future__ import annotations

import random
from bisect import bisect_right

from clocktower.producers.event_builder import EventBuilder
from clocktower.producers.simulator.config import SimConfig
from clocktower.producers.simulator.fault_schedule import FaultSchedule
from clocktower.producers.simulator.flows import Planned
from clocktower.producers.simulator.node_clock import NodeClock
from clocktower.producers.simulator.topology import BACKUP, INTERFACES, LINK_SPEED_MBPS, PRIMARY, Topology
from clocktower.schemas.telemetry import LinkState

BOOT_CARRIER_CHANGES = 1   # the port came up once at boot


class LinkMonitor:
    """Plans periodic and on-change LinkState events of every interface."""

    def __init__(self, config: SimConfig, topo: Topology, clocks: list[NodeClock], faults: FaultSchedule,
                 start_ns: int, rng: random.Random) -> None:
        self.topo = topo
        self.clocks = clocks
        self.faults = faults
        self.rng = rng
        self.period = round(1e9 / config.link_report_hz)
        self.start_ns = start_ns
        self.slot = 0
        self.phases = [1 + int(rng.random() * (self.period - 1)) for _ in range(topo.nodes)]
        self._build = EventBuilder(LinkState)
        self._transitions = {(n, ifc): faults.link_transitions(n, ifc) for n in range(topo.nodes)
                             for ifc in INTERFACES if faults.link_transitions(n, ifc)}
        # Changes not yet planned, in time order: (true time, node, interface, changes so far).
        self._changes = sorted((t, n, ifc, k + 1) for (n, ifc), ts in self._transitions.items()
                               for k, t in enumerate(ts))
        self._next_change = 0

    def plan(self, until: int, out: Planned) -> None:
        """Plan reporting periods and changes up to `until`, merged in time order.

        (Always in that order, however time is sliced, so the generator's draws
        and hence the events do not depend on the caller's tick.)
        """
        changes = self._changes
        while True:
            base = self.start_ns + self.slot * self.period
            change = changes[self._next_change][0] if self._next_change < len(changes) else None
            if change is not None and change <= until and change < base:
                _, n, ifc, count = changes[self._next_change]
                out.append((change, self._event(n, ifc, change, count)))
                self._next_change += 1
            elif base <= until:
                for n in range(self.topo.nodes):
                    t = base + self.phases[n]
                    for ifc in INTERFACES:
                        count = bisect_right(self._transitions.get((n, ifc), ()), t)
                        out.append((t, self._event(n, ifc, t, count)))
                self.slot += 1
            else:
                break

    def _event(self, node: int, interface: str, t: int, changes: int) -> LinkState:
        up = changes % 2 == 0
        return self._build(node=self.topo.node_ids[node], ts_ns=self.clocks[node].stamp(t, self.rng),
                           interface=interface, kind="ethernet", up=up,
                           carrier_changes=BOOT_CARRIER_CHANGES + changes,
                           speed_mbps=LINK_SPEED_MBPS[interface] if up else 0,
                           operstate="up" if up else "down", carrier=up,
                           backup=BACKUP if interface == PRIMARY else "")
