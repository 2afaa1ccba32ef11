"""The actuator in the agent: its settings (no built-in key), its check, and a run in the AgentRunner beside the
sources, reported apart, its acks going out through the agent's own delivery."""

from __future__ import annotations

import argparse
import os
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from clocktower.actuators.component import ActuatorComponent
from clocktower.actuators.settings import ActuatorSettings
from clocktower.actuators.simulated_routing import SimulatedRouting
from clocktower.control.intent import CommandIntent
from clocktower.control.issuer import CommandIssuer
from clocktower.producers.agent.runner import AgentRunner
from clocktower.producers.agent.source import Availability
from clocktower.runtime.errors import UserError
from clocktower.schemas.codec import encode_batch
from clocktower.schemas.control import ControlAck
from clocktower.schemas.event import Event
from clocktower.schemas.partitioning import partition_of
from tests.control_keys import TEST_PUBLIC_PEM, TEST_SIGNER
from tests.standalone_broker import StandaloneBroker

NODE = "node-a"
OWN_BACKUPS = {"eth0": "eth1"}   # the node's own topology (the backup a command names is checked against it)


def _key(tmp_path: Path) -> Path:
    path = tmp_path / "control.pub"
    path.write_bytes(TEST_PUBLIC_PEM)
    path.chmod(0o644)
    return path


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("CLOCKTOWER_DATA_DIR", "CLOCKTOWER_CONTROL_PUBLIC_KEY_FILE", "CLOCKTOWER_ACTUATOR_PUBLIC_KEY_FILE",
                 "CLOCKTOWER_ACTUATOR_DRAIN_HOOK", "CLOCKTOWER_ACTUATOR_SPARE_HOOK"):
        monkeypatch.delenv(name, raising=False)


# -- settings ----------------------------------------------------------------------------------------------------

def test_there_is_no_built_in_key() -> None:
    with pytest.raises(UserError, match="CLOCKTOWER_CONTROL_PUBLIC_KEY_FILE"):
        ActuatorSettings().public_key_path()


def test_the_key_comes_from_either_variable_or_the_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = _key(tmp_path)
    monkeypatch.setenv("CLOCKTOWER_CONTROL_PUBLIC_KEY_FILE", str(key))
    assert ActuatorSettings().public_key_path() == key
    monkeypatch.delenv("CLOCKTOWER_CONTROL_PUBLIC_KEY_FILE")
    monkeypatch.setenv("CLOCKTOWER_ACTUATOR_PUBLIC_KEY_FILE", str(key))
    assert ActuatorSettings().public_key_path() == key
    monkeypatch.delenv("CLOCKTOWER_ACTUATOR_PUBLIC_KEY_FILE")
    monkeypatch.setenv("CLOCKTOWER_DATA_DIR", str(tmp_path))
    assert ActuatorSettings().public_key_path() == key
    monkeypatch.setenv("CLOCKTOWER_DATA_DIR", str(tmp_path / "empty"))
    with pytest.raises(UserError, match="clocktower up"):
        ActuatorSettings().public_key_path()


def test_hooks_are_argv_lists_from_json_or_shell_like_strings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLOCKTOWER_ACTUATOR_DRAIN_HOOK", '["/usr/bin/drain", "--reason", "a b; rm -rf /"]')
    monkeypatch.setenv("CLOCKTOWER_ACTUATOR_SPARE_HOOK", "/usr/bin/spare --pool 'gpu pool' $(evil)")
    s = ActuatorSettings()
    assert s.drain_hook == ("/usr/bin/drain", "--reason", "a b; rm -rf /")
    assert s.spare_hook == ("/usr/bin/spare", "--pool", "gpu pool", "$(evil)")
    assert s.hooks() == {"drain": s.drain_hook, "spare": s.spare_hook} and s.hook_timeout_s == 30
    with pytest.raises(ValueError, match="list of strings"):
        ActuatorSettings(drain_hook='["ok", 3]')


# -- check ---------------------------------------------------------------------------------------------------------

def test_check_is_off_without_a_key_or_a_routing_backend(tmp_path: Path) -> None:
    no_key = ActuatorComponent(NODE, "127.0.0.1:9", SimulatedRouting, ActuatorSettings(state_dir=tmp_path / "s"),
                               backups=OWN_BACKUPS.get)
    avail = no_key.check()
    assert not avail.ok and "CLOCKTOWER_CONTROL_PUBLIC_KEY_FILE" in avail.reason

    def unusable() -> SimulatedRouting:
        raise PermissionError("rtnetlink: operation not permitted")
    settings = ActuatorSettings(public_key_file=_key(tmp_path), state_dir=tmp_path / "s")
    avail = ActuatorComponent(NODE, "127.0.0.1:9", unusable, settings, backups=OWN_BACKUPS.get).check()
    assert not avail.ok and "routing backend unusable: rtnetlink" in avail.reason
    avail = ActuatorComponent(NODE, "127.0.0.1:9", SimulatedRouting, settings, backups=OWN_BACKUPS.get).check()
    assert avail.ok and NODE in avail.reason


def test_the_runner_reports_actuators_apart_and_checks_them(tmp_path: Path) -> None:
    class Src:
        name, counts = "links", Counter[str]()

        def check(self) -> Availability:
            return Availability(False, "no links here")

        def start(self, emit: object) -> None: ...

        def stop(self) -> None: ...

    act = ActuatorComponent(NODE, "127.0.0.1:9", SimulatedRouting, ActuatorSettings(state_dir=tmp_path / "s"),
                            backups=OWN_BACKUPS.get)
    runner = AgentRunner([Src()], lambda events: None, actuators=[act])
    runner.start()
    assert runner.wait_started(10)
    runner.stop()
    report = runner.report()
    assert set(report["sources"]) == {"links"} and set(report["actuators"]) == {"actuator"}
    assert report["actuators"]["actuator"]["state"] == "off"
    with pytest.raises(ValueError, match="unique"):
        AgentRunner([Src()], lambda events: None, actuators=[Src()])


# -- a run on the real broker ------------------------------------------------------------------------------------

def test_the_agent_runs_the_actuator_and_delivers_its_acks(tmp_path: Path) -> None:
    broker = StandaloneBroker(tmp_path / "kafka")
    broker.start()
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        for fut in admin.create_topics([NewTopic("control.commands", num_partitions=4,
                                                 replication_factor=1)]).values():
            fut.result(15)
        delivered: list[Event] = []
        lock = threading.Lock()

        def sink(events: list[Event]) -> None:
            with lock:
                delivered.extend(events)
        routing = SimulatedRouting()
        settings = ActuatorSettings(public_key_file=_key(tmp_path), state_dir=tmp_path / "state")
        act = ActuatorComponent(NODE, broker.bootstrap, lambda: routing, settings, backups=OWN_BACKUPS.get)
        runner = AgentRunner([], sink, actuators=[act])
        assert act.quarantined("eth0") is None                 # not started: nothing known
        runner.start()
        assert runner.wait_started(10) and runner.status["actuator"].state == "running", runner.report()
        assert act.quarantined("eth0") is False
        cmd = CommandIssuer(TEST_SIGNER).issue(CommandIntent(NODE, "quarantine", "eth0", time.time_ns(), "inc-1",
                                                             {"from": "eth0", "to": "eth1"}))
        p = Producer({"bootstrap.servers": broker.bootstrap})
        key, value, headers = encode_batch([cmd])
        p.produce("control.commands", key=key, value=value, headers=headers, partition=partition_of(NODE, 4))
        assert p.flush(15) == 0
        deadline = time.monotonic() + 30
        while not delivered and time.monotonic() < deadline:
            time.sleep(0.05)
        live = act.stats()
        assert (live["alive"], live["loop_restarts"], live["last_error"]) == (True, 0, None), live
        runner.stop()
    finally:
        broker.stop()
    assert [(a.command_id, a.status) for a in delivered if isinstance(a, ControlAck)] == [(cmd.command_id, "applied")]
    assert routing.on_backup("eth0") and act.quarantined("eth0") is True   # what the link reports now carry
    report = runner.report()
    assert report["actuators"]["actuator"]["events"] == {"control_ack": 1}
    assert report["delivered"] == {"control_ack": 1}
    assert act.stats()["acks_applied"] == 1
    assert act.stats()["alive"] is False, "stopped: the consumer's thread has ended"


def test_the_cli_builds_the_actuator_only_with_actuate_and_kafka(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from clocktower import agent_cli
    from clocktower.actuators.route_table import KernelRouting
    from clocktower.producers.agent.link_source import LinkSource
    monkeypatch.setenv("CLOCKTOWER_ACTUATOR_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("CLOCKTOWER_ACTUATOR_WATCHDOG_MS", "0")
    assert agent_cli._actuation(argparse.Namespace(actuate=False), NODE, None) is None
    with pytest.raises(UserError, match="--actuate needs Kafka"):
        agent_cli._actuation(argparse.Namespace(actuate=True), NODE, None)
    actuation = agent_cli._actuation(argparse.Namespace(actuate=True), NODE, "127.0.0.1:9")
    assert actuation is not None
    act = actuation.component
    assert act.node == NODE and act.bootstrap == "127.0.0.1:9"
    # one routing backend for the actuator and the watchdog, which the link source feeds
    assert actuation.watchdog is not None and actuation.watchdog.routing is actuation.routing
    assert actuation.watchdog.delay_s == 0 and act._routing_factory() is actuation.routing
    links = LinkSource(NODE, interfaces=["lo"])
    actuation.watch([links])
    assert links.listeners == (actuation.watchdog.observe,)
    actuation.stop()
    routing = agent_cli.kernel_routing(ActuatorSettings(state_dir=tmp_path))
    assert isinstance(routing, KernelRouting) and routing.state_path == tmp_path / "routes.json"
    routing.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (CAP_NET_ADMIN) to build the kernel routing backend")
def test_no_watchdog_or_actuator_runs_on_a_state_dir_the_actuator_refuses(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 18: the watchdog once loaded routes.json from a state dir that the actuator had refused."""
    from clocktower import agent_cli
    planted = tmp_path / "planted"
    planted.mkdir()
    (tmp_path / "state").symlink_to(planted)
    monkeypatch.setenv("CLOCKTOWER_ACTUATOR_STATE_DIR", str(tmp_path / "state"))
    actuation = agent_cli._actuation(argparse.Namespace(actuate=True), NODE, "127.0.0.1:9")
    assert actuation is not None and actuation.routing is None and actuation.watchdog is None
    assert "is not a directory" in str(actuation.routing_error)
    assert not actuation.component.check().ok


def test_the_agent_returns_from_an_ack_only_once_the_broker_acknowledged_it() -> None:
    """The actuator commits a command's offset right after handing its acks over: publish must return only once
    those records (not the agent's other traffic) are acknowledged, and raise when they are not."""
    import threading

    from clocktower import agent_cli
    from clocktower.durable_acks import AckNotDelivered, delivered_publisher
    from clocktower.producers.kafka_publisher import KafkaPublisher
    from clocktower.schemas.control import ControlAck
    from clocktower.schemas.record_mac import check, node_key

    producer_key = b"p" * 32

    class Publisher:
        signed = KafkaPublisher.signed     # the real signing, with this node's key

        def __init__(self, answer: str) -> None:
            self.answer, self.topics, self.refused = answer, [], []
            self.node_key = node_key(producer_key, NODE)

        def publish_raw(self, topic, key, value, headers, on_delivery) -> None:  # noqa: ANN001
            self.topics.append(topic)
            self.refused.append(check(producer_key, topic, key, value, headers))   # as the streams check acks
            if self.answer == "ack":
                threading.Timer(0.05, on_delivery, (None, None)).start()   # from the publisher's own thread
            elif self.answer == "error":
                on_delivery("MSG_SIZE_TOO_LARGE", None)

    acks = [ControlAck(node=NODE, ts_ns=1_780_000_000 * 10**9, command_id=f"c{i}", status="applied")
            for i in range(3)]
    assert agent_cli._acks_to(None) is None
    ok = Publisher("ack")
    delivered_publisher(ok, 2.0)(acks)   # type: ignore[arg-type]
    assert ok.topics == ["control.acks"] and ok.refused == [None]   # signed by the node: an undrain frees a spare
    with pytest.raises(AckNotDelivered, match="not acknowledged within 0.2 s"):
        delivered_publisher(Publisher("never"), 0.2)(acks)   # type: ignore[arg-type]
    with pytest.raises(AckNotDelivered, match="refused"):
        delivered_publisher(Publisher("error"), 2.0)(acks)   # type: ignore[arg-type]


def test_the_operators_release_and_undrain_reach_the_node_and_wait_for_its_ack(tmp_path: Path) -> None:
    """`clocktower control release NODE IFACE` and `clocktower control undrain NODE` as an operator runs them: signed
    with the streams' key, sent to the node's partition, carried out by its actuator (the quarantine lifted and the
    routes restored; the undrain hook run), and the CLI prints the node's ack."""
    from clocktower.producers.kafka_publisher import KafkaPublisher
    from tests.control_keys import private_pem
    from tests.test_cli import _env, clocktower

    broker = StandaloneBroker(tmp_path / "kafka")
    broker.start()
    key = tmp_path / "control.key"
    key.write_bytes(private_pem())
    key.chmod(0o600)
    marker = tmp_path / "undrained"
    hook = tmp_path / "undrain.sh"
    hook.write_text(f'#!/bin/sh\nprintf "%s " "$@" > {marker}\necho resumed\n')
    hook.chmod(0o755)
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        for fut in admin.create_topics([NewTopic("control.commands", num_partitions=4, replication_factor=1),
                                        NewTopic("control.acks", num_partitions=1, replication_factor=1)]).values():
            fut.result(15)
        publisher = KafkaPublisher(broker.bootstrap, node_key=b"")

        def sink(events: list[Event]) -> None:
            publisher.publish(events)
            publisher.producer.flush(10)
        routing = SimulatedRouting()
        settings = ActuatorSettings(public_key_file=_key(tmp_path), state_dir=tmp_path / "state",
                                    undrain_hook=(str(hook),))
        act = ActuatorComponent(NODE, broker.bootstrap, lambda: routing, settings, backups=OWN_BACKUPS.get)
        runner = AgentRunner([], sink, actuators=[act], flush_interval_s=0.02)
        runner.start()
        assert runner.wait_started(10) and runner.status["actuator"].state == "running", runner.report()
        quarantine = CommandIssuer(TEST_SIGNER).issue(CommandIntent(NODE, "quarantine", "eth0", time.time_ns(),
                                                                    "inc-q", {"from": "eth0", "to": "eth1"}))
        p = Producer({"bootstrap.servers": broker.bootstrap})
        k, v, h = encode_batch([quarantine])
        p.produce("control.commands", key=k, value=v, headers=h, partition=partition_of(NODE, 4))
        assert p.flush(15) == 0
        deadline = time.monotonic() + 30
        while act.quarantined("eth0") is not True and time.monotonic() < deadline:
            time.sleep(0.05)
        assert act.quarantined("eth0") and routing.on_backup("eth0")
        # its own data dir: a `.clocktower` in the working directory (a demo's) holds a producer key, and with one
        # the CLI believes only node-signed acks
        env = _env(CLOCKTOWER_KAFKA_BOOTSTRAP=broker.bootstrap, CLOCKTOWER_CONTROL_PRIVATE_KEY_FILE=str(key),
                   CLOCKTOWER_DATA_DIR=str(tmp_path / "cli"))
        released = clocktower("control", "release", NODE, "eth0", "--wait", "30", env=env)
        assert released.returncode == 0, released.stderr
        assert f"{NODE}: applied" in released.stdout and "released eth0" in released.stdout, released.stdout
        assert act.quarantined("eth0") is False and not routing.on_backup("eth0")
        undrained = clocktower("control", "undrain", NODE, "--wait", "30", env=env)
        assert undrained.returncode == 0, undrained.stderr
        assert f"{NODE}: applied" in undrained.stdout and "resumed" in undrained.stdout, undrained.stdout
        assert marker.read_text().split() == ["undrain", NODE, NODE, "{}"]
        no_ack = clocktower("control", "undrain", "node-nobody", "--wait", "2", env=env)
        assert no_ack.returncode == 2 and "no ack from node-nobody within 2 s" in no_ack.stderr, no_ack.stderr
        runner.stop()
    finally:
        broker.stop()
