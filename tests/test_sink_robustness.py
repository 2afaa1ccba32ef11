"""No record stops the sink: a 70 kB key, or a record that breaks batching, becomes one dead letter."""

from __future__ import annotations

import threading
import time

import pytest

from clocktower.producers.kafka_publisher import KafkaPublisher
from clocktower.schemas.codec import REASON_LIMIT, dead_letter, encode_batch
from clocktower.schemas.telemetry import GpuHealth, LinkState
from clocktower.sinks.clickhouse.batch_set import FlushPolicy
from clocktower.sinks.clickhouse.kafka_sink import KafkaClickHouseSink
from clocktower.sinks.clickhouse.table_writer import TableWriter
from tests.event_samples import GPU_READINGS

T0 = time.time_ns()


def _links(node: str, n: int, base: int) -> list[LinkState]:
    return [LinkState(node=node, ts_ns=T0 + base + i, interface="eth0", kind="ethernet", up=True,
                      carrier_changes=i, speed_mbps=0, operstate="up", carrier=True) for i in range(n)]


def _gpus(node: str, n: int, base: int) -> list[GpuHealth]:
    return [GpuHealth(node=node, ts_ns=T0 + base + i, gpu=0, uuid="GPU-0", **GPU_READINGS) for i in range(n)]


def test_dead_letter_of_a_huge_key_and_reason_fits_the_model() -> None:
    key = b"k" * 70_000
    dl = dead_letter("telemetry.links", 0, 7, key, b"v", "r" * 200_000, "sink")
    assert len(dl.node) <= 256 and dl.node.endswith("[70000 chars]")
    assert len(dl.reason) <= REASON_LIMIT
    encode_batch([dl])  # and it still encodes


@pytest.mark.e2e
def test_a_70kB_key_is_dead_lettered_and_the_sink_goes_on(services) -> None:
    s, client = services.settings, services.client
    writer = TableWriter(client)
    writer.ensure_schema()
    pub = KafkaPublisher(s.bootstrap)
    pub.publish_batch(_links("node-a", 10, 0))
    pub.publish_batch(_gpus("node-a", 10, 0))
    # Events from "node-b" under a 70 kB key: the reason quotes the key, far past the model's limit.
    _, value, headers = encode_batch(_links("node-b", 3, 100))
    pub.publish_raw("telemetry.links", b"x" * 70_000, value, headers)
    pub.publish_batch(_links("node-a", 10, 200))
    pub.publish_batch(_gpus("node-a", 10, 200))
    assert pub.flush(30) == 0 and not pub.failed

    sink = KafkaClickHouseSink(s.bootstrap, writer, topics=["telemetry.links", "telemetry.gpu", "deadletter"],
                               group_id="test-robust", policy=FlushPolicy(max_rows=1000, max_age_s=0.2),
                               instance_id="robust-a")
    stop = threading.Event()
    failure: list[BaseException] = []

    def run() -> None:
        try:
            sink.run(stop)
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            failure.append(exc)

    t = threading.Thread(target=run)
    t.start()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and t.is_alive() and sink.rows_inserted < 41:
            time.sleep(0.2)   # 20 link rows, 20 GPU rows and the dead letter (the client is the sink's: not here)
    finally:
        stop.set()
        t.join(30)
    assert not failure, f"the sink died: {failure[0]!r}"
    assert client.query("SELECT count() FROM link_states").result_rows[0][0] == 20
    assert client.query("SELECT count() FROM gpu_health").result_rows[0][0] == 20
    rows = client.query("SELECT origin_topic, length(node), length(reason) FROM deadletter").result_rows
    assert len(rows) == 1 and rows[0][0] == "telemetry.links" and rows[0][1] <= 256
    assert sink.deadlettered == 1
