"""A lost GPU whose report reaches the streams 90 s late still gets its drain and spare applied.

Through the real broker, stream worker, sink, ClickHouse engine and actuators (the demo's, with a harmless hook).
Before issue 17 a command expired 60 s after its fault's event time: a loaded machine whose streams lagged a minute
sent drains that every node refused as expired, and nothing ordered them again.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from clocktower.demo_actuators import SPARE_NODE, DemoActuators
from clocktower.producers.kafka_publisher import KafkaPublisher
from clocktower.runtime.credentials import control_public_key_path
from clocktower.schemas.telemetry import GpuHealth
from tests.conftest import start_pipeline
from tests.event_samples import GPU_READINGS

pytestmark = pytest.mark.e2e
S = 10**9
NODE = "node-late"


def _acks(client, node: str) -> list[tuple]:  # noqa: ANN001
    return [tuple(r) for r in client.query(
        "SELECT action, status, detail FROM control_acks WHERE node = {n:String} ORDER BY ts_ns",
        parameters={"n": node}).result_rows]


def test_a_lost_gpu_reported_90_s_late_is_still_drained_and_replaced(tmp_path: Path) -> None:
    p = start_pipeline(tmp_path / "ct", worker_env={"CLOCKTOWER_STREAMS_SPARE_NODES": SPARE_NODE,
                                                    "CLOCKTOWER_STREAMS_KNOWN_AFTER_S": "0"})   # a fleet just started
    actuators = DemoActuators(p.settings.bootstrap, [NODE, SPARE_NODE], control_public_key_path(p.stack.data_dir),
                              tmp_path / "actuators")
    try:
        actuators.start()
        deadline = time.monotonic() + 60
        while not p.client.query("EXISTS TABLE control_acks").result_rows[0][0]:   # the sink creates it at start
            assert time.monotonic() < deadline
            time.sleep(0.2)
        publisher = KafkaPublisher(p.settings.bootstrap)
        late = time.time_ns() - 90 * S
        publisher.publish([GpuHealth(node=NODE, ts_ns=late, gpu=2, uuid="GPU-2", **{**GPU_READINGS, "lost": True})])
        assert publisher.flush() == 0
        deadline = time.monotonic() + 90
        while not (("drain", "applied") in [a[:2] for a in _acks(p.client, NODE)]
                   and ("spare", "applied") in [a[:2] for a in _acks(p.client, SPARE_NODE)]):
            assert time.monotonic() < deadline, (_acks(p.client, NODE), _acks(p.client, SPARE_NODE))
            time.sleep(0.5)
        assert not [a for a in _acks(p.client, NODE) + _acks(p.client, SPARE_NODE) if a[1] != "applied"]
    finally:
        actuators.stop()
        p.stack.stop()
