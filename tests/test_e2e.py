"""End to end: simulator -> real broker -> Faust streams -> sink -> real ClickHouse engine."""

from __future__ import annotations

import time

import pytest

from clocktower.control.key_files import verifier_from_file
from clocktower.drain import wait_drained
from clocktower.producers.kafka_publisher import KafkaPublisher
from clocktower.producers.simulator import FleetSimulator, SimConfig, run_simulation
from clocktower.runtime.credentials import control_public_key_path
from clocktower.schemas.control import ControlCommand
from clocktower.schemas.topics import BY_SCHEMA
from clocktower.summary import table_rows

pytestmark = pytest.mark.e2e


def _wait_tables(client, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if client.query("SELECT count() FROM system.tables WHERE name = 'deadletter'").result_rows[0][0]:
            return
        time.sleep(0.2)
    raise AssertionError("sink never created its tables")


def test_pipeline_counts_are_exact_flap_is_remediated_and_bad_records_are_dead_lettered(pipeline) -> None:
    s, client = pipeline.settings, pipeline.client
    _wait_tables(client)
    publisher = KafkaPublisher(s.bootstrap)
    sim = FleetSimulator(SimConfig(nodes=3, duration_s=10, seed=7), start_ns=time.time_ns() - 15 * 10**9)   # (past)
    produced = run_simulation(sim, publisher, 10, realtime=False)
    # Two malformed records in the middle of good traffic: bad JSON, and an unknown schema version.
    publisher.publish_raw("telemetry.links", b"node-0", b"{broken json",
                          [("ct-schema", b"link_state"), ("ct-version", b"1")])
    publisher.publish_raw("telemetry.gpu", b"node-1", b"[]", [("ct-schema", b"gpu_health"), ("ct-version", b"9")])
    more = run_simulation(FleetSimulator(SimConfig(nodes=3, duration_s=2, seed=8, faults=False)), publisher, 2,
                          realtime=False)
    assert publisher.flush(30) == 0 and not publisher.failed
    produced.update(more)
    assert wait_drained(s.bootstrap, 120, check=pipeline.stack.supervise), "pipeline did not drain"

    rows = table_rows(client)
    for schema, n in produced.items():
        assert rows[BY_SCHEMA[schema].table] == n, f"{schema}: produced {n}, stored {rows[BY_SCHEMA[schema].table]}"
    # every tx sample met its rx sample exactly once
    assert rows["flow_latency"] == produced["flow_sample"] // 2

    dead = client.query("SELECT origin_topic, reason FROM deadletter FINAL ORDER BY origin_topic").result_rows
    assert [t for t, _ in dead] == ["telemetry.gpu", "telemetry.links"]
    assert "unsupported version" in dead[0][1] and "invalid json" in dead[1][1].lower()

    # The flap's first 0.3 s down outlasts the watchdog (50 ms): a link_down incident opens with the failover,
    # and the flap burst updates that one incident rather than opening a second.
    flaps = client.query("SELECT node, target, state, kind, incident_id, command_ids FROM incidents FINAL "
                         "WHERE kind IN ('link_down', 'link_flap') ORDER BY ts_ns").result_rows
    assert [r[:4] for r in flaps][:2] == [("node-1.demo", "node-1.demo/eth0", "open", "link_down"),
                                         ("node-1.demo", "node-1.demo/eth0", "update", "link_flap")]
    assert len({r[4] for r in flaps}) == 1, "one flap, one incident"
    cmds = client.query("SELECT * FROM control_commands WHERE action = 'failover'")
    assert cmds.row_count == 1 and flaps[0][5] == [cmds.result_rows[0][cmds.column_names.index("command_id")]]
    cmd = ControlCommand(**{k: v for k, v in zip(cmds.column_names, cmds.result_rows[0], strict=True)
                            if k in ControlCommand.model_fields})
    assert cmd.node == "node-1.demo" and cmd.target == "eth0" and cmd.params["to"] == "eth1"
    verifier = verifier_from_file(control_public_key_path(pipeline.settings.data_dir))
    assert verifier.verify(cmd), "the stored command must carry a valid signature"
