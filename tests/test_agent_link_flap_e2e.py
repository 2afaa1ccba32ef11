"""A real link flap, end to end: a veth named eth0 flapped inside a network namespace, seen by the agent's
netlink source, published through the spooling publisher, detected by the stream processors, and stored in
ClickHouse as one incident (link_down when the first down outlasts the watchdog, updated to link_flap by the
burst) with a signed failover command to the configured backup, then a restore once the port is stable for
T_stable (10 s; which needs the source's periodic reports)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from clocktower.control.key_files import verifier_from_file
from clocktower.producers.agent.config import parse_link_backups
from clocktower.producers.agent.link_source import LinkSource
from clocktower.producers.agent.port_topology import PortTopology
from clocktower.producers.agent.runner import AgentRunner
from clocktower.producers.spooling_publisher import SpoolingPublisher
from clocktower.runtime.credentials import control_public_key_path
from clocktower.schemas.control import ControlCommand
from tests.netns import namespace_with_veth

NODE = "flap-e2e"


@pytest.fixture
def eth0_netns() -> Iterator[str]:
    with namespace_with_veth(f"ctflap{os.getpid()}", "eth0", "peer0") as ns:   # eth0 fails over to eth1
        yield ns


def _rows(client, sql: str, want: int, deadline: float, pipeline) -> list:  # noqa: ANN001
    rows: list = []
    while time.monotonic() < deadline:
        rows = client.query(sql).result_rows
        if len(rows) >= want:
            return rows
        pipeline.stack.supervise()
        time.sleep(0.3)
    return rows


def test_a_flapping_veth_opens_an_incident_fails_over_and_restores(pipeline, eth0_netns: str,
                                                                   tmp_path: Path) -> None:
    from pyroute2 import IPRoute

    publisher = SpoolingPublisher(pipeline.settings.bootstrap, tmp_path / "spool")
    # What CLOCKTOWER_AGENT_LINK_BACKUPS=eth0=eth1 configures: the reports name eth1 as eth0's backup.
    topology = PortTopology.build({}, parse_link_backups("eth0=eth1"))
    runner = AgentRunner([LinkSource(NODE, interfaces=["eth0"], netns=eth0_netns, report_interval_s=0.5,
                                     topology=lambda: topology)], publisher.publish)
    runner.start()
    try:
        assert runner.wait_started(30)               # sources start in the background: the snapshot first
        with IPRoute(netns=eth0_netns, flags=0) as ip:
            peer = ip.link_lookup(ifname="peer0")[0]
            time.sleep(1.0)
            for _ in range(3):                       # 3 down/up cycles: 6 carrier changes within 10 s
                ip.link("set", index=peer, state="down")
                time.sleep(0.3)
                ip.link("set", index=peer, state="up")
                time.sleep(0.3)
        time.sleep(11.5)                             # stable for more than the detector's T_stable (10 s)
    finally:
        runner.stop()
        assert publisher.flush(30) == 0
        publisher.close()
    client = pipeline.client
    deadline = time.monotonic() + 60
    opened = _rows(client, f"SELECT target FROM incidents FINAL WHERE node = '{NODE}' AND state = 'open'", 1,
                   deadline, pipeline)
    assert opened == [(f"{NODE}/eth0",)]            # one flap, one incident
    cmds = client.query(f"SELECT * FROM control_commands FINAL WHERE node = '{NODE}' ORDER BY ts_ns")
    assert [r[cmds.column_names.index("action")] for r in cmds.result_rows][:1] == ["failover"]
    assert [r[cmds.column_names.index("action")] for r in cmds.result_rows].count("failover") == 1
    cmd = ControlCommand(**{k: v for k, v in zip(cmds.column_names, cmds.result_rows[0], strict=True)
                            if k in ControlCommand.model_fields})
    assert cmd.target == "eth0" and cmd.params["to"] == "eth1"
    assert verifier_from_file(control_public_key_path(pipeline.settings.data_dir)).verify(cmd)
    resolved = _rows(client, f"SELECT count() FROM incidents FINAL WHERE node = '{NODE}' AND state = 'resolve' "
                     "HAVING count() > 0", 1, deadline, pipeline)
    assert resolved, "the incident was never resolved: no report after the port became stable?"
    restore = _rows(client, f"SELECT params FROM control_commands FINAL WHERE node = '{NODE}' "
                    "AND action = 'restore'", 1, deadline, pipeline)
    assert restore and restore[0][0]["to"] == "eth0"
