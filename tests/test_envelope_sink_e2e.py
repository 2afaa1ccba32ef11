"""Through the real broker and sink: records that break the envelope rules become dead letters with their reason."""

from __future__ import annotations

import threading
import time

import pytest

from clocktower.producers.kafka_publisher import KafkaPublisher
from clocktower.schemas.codec import H_COUNT, encode_batch
from clocktower.schemas.telemetry import LinkState
from clocktower.sinks.clickhouse.batch_set import FlushPolicy
from clocktower.sinks.clickhouse.kafka_sink import KafkaClickHouseSink
from clocktower.sinks.clickhouse.table_writer import TableWriter

HOUR = 3600 * 10**9


def _links(node: str, n: int, ts_ns: int) -> list[LinkState]:
    return [LinkState(node=node, ts_ns=ts_ns + i, interface="eth0", kind="ethernet", up=True, carrier_changes=i,
                      speed_mbps=0, operstate="up", carrier=True) for i in range(n)]


@pytest.mark.e2e
def test_keyless_miscounted_and_future_records_are_dead_lettered(services) -> None:
    s, client = services.settings, services.client
    writer = TableWriter(client)
    writer.ensure_schema()
    now = time.time_ns()
    pub = KafkaPublisher(s.bootstrap, node_key=b"")
    pub.publish(_links("node-good", 5, now))
    _, value, headers = encode_batch(_links("node-k", 2, now))
    pub.publish_raw("telemetry.links", None, value, headers)                                   # keyless
    key, value, headers = encode_batch(_links("node-c", 3, now))
    pub.publish_raw("telemetry.links", key, value, [*(x for x in headers if x[0] != H_COUNT), (H_COUNT, b"5")])
    pub.publish_raw("telemetry.links", *encode_batch(_links("node-y", 1, now + 365 * 24 * HOUR)))  # a year ahead
    pub.publish_raw("telemetry.links", *encode_batch(_links("node-h", 1, now + HOUR)))   # beyond this sink's skew
    assert pub.flush(30) == 0 and not pub.failed

    sink = KafkaClickHouseSink(s.bootstrap, writer, topics=["telemetry.links", "deadletter"], group_id="test-env",
                               policy=FlushPolicy(max_rows=1000, max_age_s=0.2), instance_id="env-a",
                               max_future_skew_ns=60 * 10**9)
    stop = threading.Event()
    t = threading.Thread(target=sink.run, args=(stop,))
    t.start()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and t.is_alive() and sink.rows_inserted < 9:
            time.sleep(0.2)   # 5 link rows and 4 dead letters
    finally:
        stop.set()
        t.join(30)
    assert client.query("SELECT count() FROM link_states").result_rows[0][0] == 5
    reasons = {r[0]: r[1] for r in client.query("SELECT node, reason FROM deadletter FINAL").result_rows}
    assert set(reasons) == {"unknown", "node-c", "node-y", "node-h"}, reasons
    assert "no key" in reasons["unknown"]
    assert "ct-count '5'" in reasons["node-c"] and "3 events" in reasons["node-c"]
    assert "ahead of the decoder's clock" in reasons["node-y"] and "ahead" in reasons["node-h"]
