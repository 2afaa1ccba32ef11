"""Names and addresses of the simulated fleet: nodes, ranks, interfaces, GPUs.

Data-plane addresses come from the benchmarking range 198.18.0.0/15 and are
only strings; the simulator never sends traffic. Node i has eth0 =
198.18.i.1 and eth1 = 198.19.i.1 (past node 255 the node number carries into
the last octet, so addresses stay unique and valid).
"""

from __future__ import annotations

from dataclasses import dataclass, field

JOB_ID = "job-demo"
COMMUNICATOR = "world"
PRIMARY = "eth0"
BACKUP = "eth1"
INTERFACES = (PRIMARY, BACKUP)
LINK_SPEED_MBPS = {PRIMARY: 400_000, BACKUP: 400_000}
ROCE_PORT = 4791
FLOW_PORT_BASE = 40_000
FLOW_PORT_SPAN = 25_000


def node_id(i: int) -> str:
    """Node i's name, which is also its records' Kafka key. librdkafka's default partitioner (CRC-32 of the key,
    modulo the partition count) put node-0 .. node-3 all in partition 1 of every 2-partition topic; with the
    `.demo` suffix the first 2 nodes cover both partitions of a 2-partition topic and the first 4 every partition
    of a 4-partition one: the default 4-node demo uses every partition of every topic."""
    return f"node-{i}.demo"


def interface_ip(i: int, interface: str) -> str:
    second = 18 if interface == PRIMARY else 19
    return f"198.{second}.{i % 256}.{1 + i // 256}"


@dataclass(frozen=True)
class Topology:
    """N nodes of G GPUs; global rank = node_index * G + gpu."""

    nodes: int
    gpus_per_node: int
    node_ids: tuple[str, ...] = field(init=False)
    ips: tuple[dict[str, str], ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "node_ids", tuple(node_id(i) for i in range(self.nodes)))
        object.__setattr__(self, "ips", tuple({ifc: interface_ip(i, ifc) for ifc in INTERFACES}
                                              for i in range(self.nodes)))

    @property
    def ranks(self) -> int:
        return self.nodes * self.gpus_per_node

    def rank(self, node: int, gpu: int) -> int:
        return node * self.gpus_per_node + gpu

    def node_of(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def ring_next(self, node: int) -> int:
        """The node this node sends to in the ring all-reduce."""
        return (node + 1) % self.nodes

    @staticmethod
    def flow_port(rank: int) -> int:
        """The stable source port of the RoCE flow a rank sends on."""
        return FLOW_PORT_BASE + rank % FLOW_PORT_SPAN

    def gpu_uuid(self, node: int, gpu: int) -> str:
        return f"GPU-{self.node_ids[node]}-{gpu}"
