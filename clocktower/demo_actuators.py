"""The demo's simulated nodes run the real actuator: the loop closes in `make demo` as on a fleet.

Each simulated node, and the demo's spare node (the streams' spare pool, so a lost GPU gets a `spare` command
that a running actuator answers), gets the agent's parts: `open_actuator` with its own `SimulatedRouting` (the
simulator's ports eth0/eth1) and a `CommandConsumer` on its own thread, reading its partition of control.commands,
verifying with the data dir's public key, and publishing its acks to Kafka. Drain and spare run a real, harmless
hook (a Python one-liner that prints its arguments: no shell), so the hook path is exercised too.

Up to `ALL_NODES_UP_TO` simulated nodes every one runs an actuator; a bigger fleet runs them on the nodes with
injected faults only (the pipeline's commands go there), as one Kafka consumer per node is too many threads for
a simulated fleet of thousands. A command to a node without one shows as unacked in the summary.

Every run starts from nothing, as the simulated fleet is a new one: the actuators' state dir is emptied (else
this run's ids could meet last run's memories) and each node's consumer group is moved past the commands of
earlier runs (else commands of the last hour, never committed by an interrupted run, would be applied again).
"""

from __future__ import annotations

import logging
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from clickhouse_connect.driver.client import Client
from confluent_kafka import Consumer, TopicPartition

from clocktower.actuators.actuator import Actuator
from clocktower.actuators.command_consumer import TOPIC, CommandConsumer, group_of
from clocktower.actuators.component import open_actuator
from clocktower.actuators.hooks import Hooks
from clocktower.actuators.simulated_redirector import SimulatedRedirector
from clocktower.actuators.simulated_routing import SimulatedRouting
from clocktower.actuators.simulated_shaper import SimulatedShaper
from clocktower.control.key_files import verifier_from_file
from clocktower.control.signing import CommandVerifier
from clocktower.producers.kafka_publisher import KafkaPublisher
from clocktower.producers.simulator.topology import BACKUP, PRIMARY
from clocktower.runtime.private_file import private_dir
from clocktower.schemas.event import Event
from clocktower.schemas.partitioning import partition_of

log = logging.getLogger(__name__)
SPARE_NODE = "spare-0.demo"
INTERFACES = (PRIMARY, BACKUP)
HOOK = (sys.executable, "-c", "import sys; print('demo hook:', *sys.argv[1:4])")   # + action, node, target, params
ALL_NODES_UP_TO = 32
STOP_TIMEOUT_S = 20.0
ACK_FLUSH_S = 10.0


def demo_hooks() -> Hooks:
    return Hooks({"drain": HOOK, "spare": HOOK}, timeout_s=10.0)


def simulated_node_actuator(node: str, verifier: CommandVerifier, state_dir: Path, hooks: Hooks,
                            routing: SimulatedRouting | None = None, shaper: SimulatedShaper | None = None,
                            redirector: SimulatedRedirector | None = None) -> Actuator:
    """A simulated node's real actuator: its ports PRIMARY (backed by BACKUP) and BACKUP, on simulated routing,
    shaping and flow redirection (new ones unless given)."""
    return open_actuator(node, verifier, SimulatedRouting(INTERFACES) if routing is None else routing, state_dir,
                         hooks, backups=lambda link: BACKUP if link == PRIMARY else "",
                         shaper=SimulatedShaper() if shaper is None else shaper,
                         redirector=SimulatedRedirector(f"{BACKUP} (the alternate of {PRIMARY})")
                         if redirector is None else redirector)


def actuated_nodes(fleet: Sequence[str], faulty: Iterable[str]) -> list[str]:
    """The nodes that run an actuator: all of `fleet` up to ALL_NODES_UP_TO, else the `faulty` ones; + the spare."""
    chosen = fleet if len(fleet) <= ALL_NODES_UP_TO else [n for n in fleet if n in set(faulty)]
    return list(dict.fromkeys([*chosen, SPARE_NODE]))


class DemoActuators:
    """One real actuator per node in `nodes`, with its state under `state_root` (emptied at `start`)."""

    def __init__(self, bootstrap: str, nodes: Sequence[str], public_key: Path, state_root: Path,
                 producer_key: bytes | None = None) -> None:
        """`producer_key`: each node's acks are signed with that node's key, derived from it, as its agent would."""
        self.bootstrap = bootstrap
        self.producer_key = producer_key
        self.nodes = list(dict.fromkeys(nodes))
        self.public_key = public_key
        self.state_root = state_root
        self.publisher: KafkaPublisher | None = None
        self.routing = {n: SimulatedRouting(INTERFACES) for n in self.nodes}
        self.shapers = {n: SimulatedShaper() for n in self.nodes}
        self.redirectors = {n: SimulatedRedirector(f"{BACKUP} (the alternate of {PRIMARY})") for n in self.nodes}
        self.actuators: dict[str, Actuator] = {}
        self.consumers: dict[str, CommandConsumer] = {}
        self._threads: dict[str, threading.Thread] = {}
        self._stop = threading.Event()

    def start(self) -> None:
        verifier = verifier_from_file(self.public_key)
        shutil.rmtree(self.state_root, ignore_errors=True)
        self.publisher = KafkaPublisher(self.bootstrap, producer_key=self.producer_key)
        hooks = demo_hooks()
        for node in self.nodes:
            skip_earlier_commands(self.bootstrap, node)
            state = self.state_root / node
            private_dir(state)
            act = simulated_node_actuator(node, verifier, state, hooks, self.routing[node], self.shapers[node],
                                          self.redirectors[node])
            self.actuators[node] = act
            self.consumers[node] = cons = CommandConsumer(self.bootstrap, act, self._publish)
            thread = threading.Thread(target=cons.run, args=(self._stop,), name=f"actuator-{node}", daemon=True)
            self._threads[node] = thread
            thread.start()

    def _publish(self, acks: list[Event]) -> None:
        """Acks are delivered before the consumer commits their commands (it retries when this raises)."""
        assert self.publisher is not None
        self.publisher.publish(acks)
        if self.publisher.flush(ACK_FLUSH_S):
            raise RuntimeError(f"acks not delivered within {ACK_FLUSH_S:g} s")

    def stop(self) -> list[str]:
        """Stop the consumers (their last acks are published and committed); returns what went wrong."""
        self._stop.set()
        problems = []
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for node, thread in self._threads.items():
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                problems.append(f"the actuator of {node} did not stop within {STOP_TIMEOUT_S:g} s")
            else:
                self.actuators[node].close()
        if self.publisher is not None and self.publisher.flush(ACK_FLUSH_S):
            problems.append("some control acks were not delivered")
        if self.publisher is not None and sum(self.publisher.failed.values()):
            problems.append(f"{sum(self.publisher.failed.values())} control acks failed delivery to Kafka")
        self._threads, self.actuators = {}, {}
        return problems

    def stats(self) -> dict[str, dict[str, object]]:
        return {n: c.stats() for n, c in self.consumers.items()}


def skip_earlier_commands(bootstrap: str, node: str, timeout: float = 10.0) -> None:
    """Commit the end of `node`'s partition for its actuator group: its consumer starts after earlier runs."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group_of(node), "enable.auto.commit": False,
                         "logger": logging.getLogger("rdkafka")})
    try:
        meta = consumer.list_topics(timeout=timeout).topics.get(TOPIC)   # all: naming one creates it here
        if meta is None or meta.error is not None or not meta.partitions:
            return   # no topic yet: nothing earlier to skip
        partition = partition_of(node, len(meta.partitions))
        _low, high = consumer.get_watermark_offsets(TopicPartition(TOPIC, partition), timeout=timeout)
        consumer.commit(offsets=[TopicPartition(TOPIC, partition, high)], asynchronous=False)
    finally:
        consumer.close()


def unacked_commands(client: Client, since_ns: int) -> int:
    """Control commands stored since `since_ns` that have no ack stored yet."""
    return int(client.query(
        "SELECT count() FROM control_commands FINAL WHERE ts_ns >= {s:Int64} AND command_id NOT IN "
        "(SELECT command_id FROM control_acks WHERE ts_ns >= {s:Int64})", parameters={"s": since_ns}
    ).result_rows[0][0])


def wait_acked(client: Client, since_ns: int, timeout: float, on_poll: Callable[[int], None] = lambda n: None,
               check: Callable[[], object] = lambda: None) -> bool:
    """True once every command since `since_ns` has an ack in ClickHouse; False after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        check()
        n = unacked_commands(client, since_ns)
        on_poll(n)
        if n == 0:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.5)
