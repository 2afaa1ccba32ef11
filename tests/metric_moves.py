"""What the self-metrics tests do to move the actuator's and the agent's metrics through their own code paths:
a simulated-port actuator, a signed failover for it, and heartbeats handed to (or dropped by) an agent runner.
tests/test_self_metrics.py checks each move; tests/test_promql.py moves them all for Prometheus to scrape."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

from clocktower.actuators.actuator import Actuator
from clocktower.actuators.component import open_actuator
from clocktower.actuators.simulated_routing import SimulatedRouting
from clocktower.agent_cli import _serve_metrics
from clocktower.producers.agent.config import AgentSettings
from clocktower.producers.agent.runner import AgentRunner
from clocktower.schemas.control import ControlCommand
from clocktower.schemas.telemetry import NodeHeartbeat
from tests.control_keys import TEST_SIGNER, resigned
from tests.event_samples import SAMPLES


def simulated_actuator(state_dir: Path) -> Actuator:
    """node-1's actuator with eth0 (backup eth1) on simulated routing, trusting the test signer."""
    return open_actuator("node-1", TEST_SIGNER.verifier(), SimulatedRouting(("eth0", "eth1")), state_dir,
                         backups=lambda link: "eth1" if link == "eth0" else "")


def signed_failover(command_id: str, issued_s_ago: float) -> ControlCommand:
    """A failover of node-1's eth0 to eth1, signed by the test signer, issued `issued_s_ago` seconds ago."""
    now = time.time_ns()
    return resigned(ControlCommand(node="node-1", ts_ns=now - int(issued_s_ago * 1e9), command_id=command_id,
                                   action="failover", target="eth0", params={"from": "eth0", "to": "eth1"},
                                   expires_ns=now + 60 * 10**9, signature="-"))


def heartbeats(n: int) -> list[NodeHeartbeat]:
    return [NodeHeartbeat(**SAMPLES["heartbeat"])] * n


def hand_to_kafka(n: int) -> None:
    """An agent runner hands n heartbeats to a delivery that takes them."""
    AgentRunner([], lambda batch: None)._send(heartbeats(n))   # noqa: SLF001 - the one place events leave


def fail_to_hand(n: int) -> None:
    """An agent runner whose delivery fails (a full disk) drops n heartbeats."""
    def failing(batch: list) -> None:
        raise OSError("disk full")

    AgentRunner([], failing)._send(heartbeats(n))   # noqa: SLF001


def serve_spool_metrics(records: int, events: int) -> SimpleNamespace:
    """The agent's metrics wiring (no server: port 0) over a spool holding records/events; returns the spool."""
    spool = SimpleNamespace(pending_records=records, pending_events=events)
    _serve_metrics(AgentSettings(metrics_port=0), SimpleNamespace(spool=spool))
    return spool
