"""kill -9 the Faust worker: the supervisor restarts it and it takes its partitions back at once."""

from __future__ import annotations

import os
import signal
import time

import pytest
from clickhouse_connect.driver.exceptions import DatabaseError

from clocktower.producers.kafka_publisher import KafkaPublisher
from clocktower.producers.simulator import FleetSimulator, SimConfig, run_simulation

pytestmark = pytest.mark.e2e


def test_restarted_stream_worker_resumes(pipeline) -> None:
    stack, client = pipeline.stack, pipeline.client
    publisher = KafkaPublisher(pipeline.settings.bootstrap)
    run_simulation(FleetSimulator(SimConfig(nodes=2, duration_s=3, seed=1)), publisher, 3, realtime=False)
    deadline = time.monotonic() + 60
    while not _rows(client, "flow_latency"):   # the first worker is up and has joined the group
        assert time.monotonic() < deadline, "the first stream worker produced nothing"
        time.sleep(0.5)
    worker = stack.children["streams"]
    os.kill(worker.pid, signal.SIGKILL)
    worker.proc.wait()
    assert stack.supervise() == ["streams"]
    before = _rows(client, "flow_latency")
    run_simulation(FleetSimulator(SimConfig(nodes=2, duration_s=3, seed=2)), publisher, 3, realtime=False)
    deadline = time.monotonic() + 60
    while _rows(client, "flow_latency") <= before:
        assert time.monotonic() < deadline, "the restarted stream worker never resumed"
        stack.supervise()
        time.sleep(0.5)


def _rows(client, table: str) -> int:
    try:
        return int(client.query(f"SELECT count() FROM {table}").result_rows[0][0])
    except DatabaseError:  # the sink creates the tables a moment after start
        return 0
