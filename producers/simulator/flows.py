"""Inter-node RoCE flows of the ring all-reduce, as tx/rx FlowSamples.

For every all-reduce bucket, each directed ring link node i -> node i+1
carries `segments_per_bucket` segments spread over the bucket's
communication window. Segment k rides the flow of the sender's local GPU
k mod G (source port 40000 + rank). Each segment is reported twice with the
same 5-tuple and `seq`: tx by the sender at send time, rx by the receiver at
arrival, each on its own node's clock.

The path is eth0 <-> eth0, or eth1 <-> eth1 while either end's eth0 is down.
True one-way latency = 5 µs + jitter + queueing; on a congested link the
queueing is 50-500 µs.
"""

from __future__ import annotations

import random
from math import log

from clocktower.producers.event_builder import EventBuilder
from clocktower.producers.simulator.fault_schedule import FaultSchedule
from clocktower.producers.simulator.node_clock import NodeClock
from clocktower.producers.simulator.topology import BACKUP, PRIMARY, ROCE_PORT, Topology
from clocktower.schemas.event import Event
from clocktower.schemas.telemetry import FlowSample

BASE_LATENCY_NS = 5_000
JITTER_NS = 300.0
QUEUE_MEAN_NS = 800.0
CONGESTED_QUEUE_NS = (50_000, 500_000)
PACKET_BYTES = 4096
PRIORITY = 3

Planned = list[tuple[int, Event]]


class RingFlows:
    """Emits the flow samples of each all-reduce bucket on every ring link."""

    def __init__(self, topo: Topology, clocks: list[NodeClock], faults: FaultSchedule, segments: int,
                 link_bytes: int, rng: random.Random) -> None:
        self.topo = topo
        self.clocks = clocks
        self.faults = faults
        self.segments = segments
        self.rng = rng
        self._flapping = [faults.flapping(n) for n in range(topo.nodes)]
        self._seq: dict[tuple[int, str], int] = {}
        self._flow = EventBuilder(FlowSample)
        # Each link carries link_bytes per bucket, split as evenly as whole bytes allow.
        q, r = divmod(link_bytes, segments)
        self._seg_bytes = [q + (1 if k < r else 0) for k in range(segments)]
        self._seg_packets = [-(-b // PACKET_BYTES) for b in self._seg_bytes]

    def bucket(self, w0: int, w1: int, out: Planned) -> None:
        """Plan the segments of one bucket whose inter-node traffic spans true [w0, w1]."""
        topo, faults, clocks, rng = self.topo, self.faults, self.clocks, self.rng
        g_count = topo.gpus_per_node
        segs = self.segments
        step = (w1 - w0) / segs
        jitter_max = max(1.0, step / 4)
        build = self._flow
        seqs = self._seq
        rand, gauss = rng.random, rng.gauss
        link_up = faults.link_up
        for i in range(topo.nodes):
            j = topo.ring_next(i)
            tx_stamp, rx_stamp = clocks[i].stamp, clocks[j].stamp
            tx_node, rx_node = topo.node_ids[i], topo.node_ids[j]
            congested = faults.congested(i, j, w0)
            flapping = self._flapping[i] or self._flapping[j]
            for k in range(segs):
                t_send = w0 + int((k + 0.25) * step + rand() * jitter_max)
                ifc = PRIMARY
                if flapping and not (link_up(i, PRIMARY, t_send) and link_up(j, PRIMARY, t_send)):
                    ifc = BACKUP
                if congested:
                    queue = CONGESTED_QUEUE_NS[0] + rand() * (CONGESTED_QUEUE_NS[1] - CONGESTED_QUEUE_NS[0])
                else:
                    queue = -QUEUE_MEAN_NS * log(1.0 - rand())
                t_recv = t_send + BASE_LATENCY_NS + int(abs(gauss(0.0, JITTER_NS)) + queue)
                rank = i * g_count + k % g_count
                key = (rank, ifc)
                seq = seqs.get(key, 0) + 1
                seqs[key] = seq
                src_ip, dst_ip = topo.ips[i][ifc], topo.ips[j][ifc]
                port = topo.flow_port(rank)
                nbytes, packets = self._seg_bytes[k], self._seg_packets[k]
                out.append((t_send, build(
                    node=tx_node, ts_ns=tx_stamp(t_send, rng), interface=ifc, direction="tx",
                    src_ip=src_ip, dst_ip=dst_ip, src_port=port, dst_port=ROCE_PORT, proto="roce", seq=seq,
                    bytes=nbytes, packets=packets, retransmits=0, priority=PRIORITY)))
                out.append((t_recv, build(
                    node=rx_node, ts_ns=rx_stamp(t_recv, rng), interface=ifc, direction="rx",
                    src_ip=src_ip, dst_ip=dst_ip, src_port=port, dst_port=ROCE_PORT, proto="roce", seq=seq,
                    bytes=nbytes, packets=packets, retransmits=0, priority=PRIORITY)))

