"""`clocktower demo`: the whole pipeline on a simulated fleet with injected faults, whose nodes run the real
actuators (demo_actuators.py), then a summary."""

from __future__ import annotations

import threading
import time
from collections import Counter

from rich.console import Console
from rich.live import Live

from clocktower.actuators.settings import ActuatorSettings
from clocktower.config import Settings
from clocktower.demo_actuators import SPARE_NODE, DemoActuators, actuated_nodes, wait_acked
from clocktower.drain import lag, wait_drained
from clocktower.producers.kafka_publisher import KafkaPublisher
from clocktower.producers.simulator import FleetSimulator, SimConfig, run_simulation
from clocktower.producers.simulator.fault_schedule import FaultSchedule
from clocktower.producers.simulator.topology import Topology, node_id
from clocktower.progress_view import ProgressView
from clocktower.runtime.clickhouse_client import http_client
from clocktower.schemas.topics import TOPICS
from clocktower.stack import Stack
from clocktower.summary import build_summary, table_rows

ACK_TIMEOUT_S = 30.0   # after the drain, every command's ack is awaited this long
# The drain is given up once no consumer has committed anything for this long: on an overloaded machine a Faust
# commit took 33 s. A worker whose partitions stall for good is restarted by its commit-stall check only after
# 5 minutes (streams/commit_stall.py): the demo reports that as an error rather than wait.
DRAIN_STALL_S = 150.0


def run_demo(settings: Settings, duration_s: float, nodes: int, console: Console, drain_stall_s: float = DRAIN_STALL_S,
             seed: int = 0, ack_timeout: float = ACK_TIMEOUT_S) -> dict:
    # A new simulated fleet: last run's stream state is not its. A lost GPU's node is replaced from the demo's
    # spare, whose actuator runs below.
    # Every simulated node signs its records with its own key, from the producer key the stack makes (or is given):
    # the streams act on nothing unsigned. The simulated fleet is listed, so its nodes are known to the allocator
    # from their first reading (a node not listed must report for CLOCKTOWER_STREAMS_KNOWN_AFTER_S first).
    fleet = ",".join(node_id(i) for i in range(nodes))
    stack = Stack(settings, fresh_stream_state=True, sign_records=True,
                  extra_env={"CLOCKTOWER_STREAMS_SPARE_NODES": SPARE_NODE, "CLOCKTOWER_STREAMS_FLEET_NODES": fleet})
    errors: list[str] = []
    actuators: DemoActuators | None = None
    try:
        stack.start(on_step=lambda msg: console.print(f"[dim]•[/dim] {msg}"))
        client = http_client(settings.clickhouse, *settings.clickhouse_login(), settings.clickhouse_database)
        _wait_for_tables(client, stack)
        rows_before = table_rows(client)
        since_ns = time.time_ns() - 10**9
        config = SimConfig(nodes=nodes, duration_s=duration_s, seed=seed)
        actuated = actuated_nodes([node_id(i) for i in range(nodes)], _faulty_nodes(config))
        console.print(f"[dim]•[/dim] starting the actuators of {len(actuated) - 1} simulated nodes and of the "
                      f"spare {SPARE_NODE}")
        actuators = DemoActuators(settings.bootstrap, actuated,
                                  ActuatorSettings(data_dir=stack.data_dir).public_key_path(),
                                  stack.data_dir / "demo-actuators", producer_key=stack.producer_key)
        actuators.start()
        sim = FleetSimulator(config)
        publisher = KafkaPublisher(settings.bootstrap, producer_key=stack.producer_key)
        stop = threading.Event()
        produced: Counter[str] = Counter()
        sim_error: list[BaseException] = []

        def simulate() -> None:
            try:
                produced.update(run_simulation(sim, publisher, duration_s, stop=stop,
                                               ground_truth_path=stack.data_dir / "ground_truth.jsonl"))
            except BaseException as exc:  # reported in the summary, never swallowed
                sim_error.append(exc)

        view = ProgressView(duration_s)
        thread = threading.Thread(target=simulate, name="simulator", daemon=True)
        start = time.monotonic()
        with Live(view, console=console, refresh_per_second=4, transient=False):
            thread.start()
            try:
                while thread.is_alive():
                    thread.join(1.0)
                    _note_restarts(stack, view, errors)
                    view.update(min(time.monotonic() - start, duration_s), "running", publisher.acked,
                                _delta(table_rows(client), rows_before))
                view.update(duration_s, "draining", publisher.acked)
                drained = wait_drained(   # however long a loaded machine takes, while the consumers get on
                    settings.bootstrap, None, stall_s=drain_stall_s,
                    on_poll=lambda n: view.update(duration_s, f"draining, lag {n:,}", publisher.acked,
                                                  _delta(table_rows(client), rows_before)),
                    check=lambda: _note_restarts(stack, view, errors))
                acked = wait_acked(
                    client, since_ns, ack_timeout,
                    on_poll=lambda n: view.update(duration_s, f"waiting for acks, {n:,} commands unacked",
                                                  publisher.acked, _delta(table_rows(client), rows_before)),
                    check=lambda: _note_restarts(stack, view, errors))
                errors += actuators.stop()   # the last acks are published and committed
                if not acked:   # acks published while stopping still reach ClickHouse; the summary names the rest
                    wait_drained(settings.bootstrap, 30.0, check=lambda: _note_restarts(stack, view, errors))
                view.update(duration_s, "done", publisher.acked, _delta(table_rows(client), rows_before))
            except KeyboardInterrupt:
                stop.set()
                thread.join(10)
                errors.append("interrupted by the user")
                drained = True
        if sim_error:
            errors.append(f"simulator failed: {sim_error[0]!r}")
        if not drained:
            errors.append(f"pipeline stopped draining: nothing committed for {drain_stall_s:.0f} s "
                          f"(lag {lag(settings.bootstrap)})")
        produced = produced or publisher.acked
        return build_summary(client, produced, sum(publisher.failed.values()), errors, rows_before, since_ns,
                             sim.clocks)
    finally:
        try:
            if actuators is not None:
                actuators.stop()
        finally:
            stack.stop()


def _faulty_nodes(config: SimConfig) -> set[str]:
    """The nodes the run's faults hit (the schedule depends on the config only; its start time just shifts it)."""
    return {f.node for f in FaultSchedule(config, Topology(config.nodes, config.gpus_per_node), time.time_ns()).faults}


def _delta(now: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {t: n - before.get(t, 0) for t, n in now.items()}


def _note_restarts(stack: Stack, view: ProgressView, errors: list[str]) -> None:
    for name in stack.supervise():
        msg = f"{name} crashed and was restarted (log: {stack.children[name].log_path})"
        view.notes.append(f"[yellow]{msg}[/yellow]")
        errors.append(msg)


def _wait_for_tables(client, stack: Stack, timeout: float = 60.0) -> None:  # noqa: ANN001
    """The sink creates the tables at start (and a new release's new ones in an old data dir); wait for every
    registry table so the first counts make sense."""
    tables = sorted({t.table for t in TOPICS})
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stack.supervise()
        found = client.query("SELECT count() FROM system.tables WHERE database = currentDatabase() AND name IN "
                             "{tables:Array(String)}", parameters={"tables": tables}).result_rows[0][0]
        if found == len(tables):
            return
        time.sleep(0.2)
    raise TimeoutError("the sink did not create its tables within 60 s")
