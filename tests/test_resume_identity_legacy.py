"""The sink's loss check matches records stored under the rules before the envelope checks.

A record the old sink stored (up to 4 MiB of value, keyless, no ct-count, events far ahead of the clock) fails
today's decode; the check must still see it as the record its rows came from, or it would delete them as lost.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import confluent_kafka
import pytest

from clocktower.schemas.codec import H_COUNT, DecodeError, dead_letter, decode_batch, encode_batch
from clocktower.schemas.topics import BY_NAME, MAX_RECORD_BYTES
from clocktower.sinks.clickhouse.kafka_sink import KafkaClickHouseSink
from clocktower.sinks.clickhouse.partition_batch import PartitionBatch
from clocktower.sinks.clickhouse.table_writer import TableWriter
from tests.event_samples import gpu_health

GPU = "telemetry.gpu"
T0 = time.time_ns() - 3600 * 10**9   # within the tables' TTL: rows of older events go at the next merge


@pytest.fixture(scope="module")
def writer(tmp_path_factory) -> Iterator[TableWriter]:  # noqa: ANN001
    """One chdb engine for the module (a process opens only one path); each test uses its own offsets."""
    clickhouse_connect = pytest.importorskip("clickhouse_connect")
    w = TableWriter(clickhouse_connect.get_client(interface="chdb", path=str(tmp_path_factory.mktemp("ch"))))
    w.ensure_schema()
    yield w
    w.client.close()


def _sink(writer: TableWriter) -> KafkaClickHouseSink:
    sink = KafkaClickHouseSink("127.0.0.1:9", writer, topics=[GPU], group_id="test-legacy", instance_id="legacy")
    sink.consumer.close()
    return sink


def _store(writer: TableWriter, offset: int, events: list) -> None:
    batch = PartitionBatch(BY_NAME[GPU], 0)
    batch.add(offset, events)
    writer.insert(batch)


def _message(offset: int, key: bytes | None, value: bytes, headers: list) -> confluent_kafka.Message:
    return confluent_kafka.Message(topic=GPU, partition=0, offset=offset, key=key, value=value, headers=headers)


def _big_batch(ts0: int) -> list:
    """A gpu_health batch of about 2.8 MB: what the old publisher sent as one record."""
    return [gpu_health(ts_ns=ts0 + i, gpu=i % 8, uuid=f"GPU-{i % 8}-" + "u" * 40) for i in range(5500)]


def test_a_stored_record_over_the_new_limit_matches_its_rows(writer: TableWriter) -> None:
    events = _big_batch(T0)
    key, value, headers = encode_batch(events)
    assert 2_500_000 < len(value) < 4 * 1024 * 1024 and len(value) > MAX_RECORD_BYTES
    with pytest.raises(DecodeError, match="oversized"):
        decode_batch(GPU, key, value, headers)              # today's rules refuse it for new records
    _store(writer, 7, events)
    sink = _sink(writer)
    assert sink._matches(_message(7, key, value, headers), GPU, 0, 7), "stored by the old sink: the same record"
    other = _big_batch(T0 + 10**6)                          # a different record now at that offset: still a loss
    k2, v2, h2 = encode_batch(other)
    assert not sink._matches(_message(7, k2, v2, h2), GPU, 0, 7)


def test_a_stored_keyless_uncounted_future_record_matches_its_rows(writer: TableWriter) -> None:
    future = T0 + 10 * 365 * 86_400 * 10**9                 # years ahead of the clock: today a dead letter
    events = [gpu_health(ts_ns=future + i, gpu=i) for i in range(4)]
    _, value, headers = encode_batch(events)
    headers = [(k, v) for k, v in headers if k != H_COUNT]
    for key in (b"node-0", None):
        with pytest.raises(DecodeError):
            decode_batch(GPU, key, value, headers)
    _store(writer, 13, events)
    sink = _sink(writer)
    assert sink._matches(_message(13, b"node-0", value, headers), GPU, 0, 13)
    assert sink._matches(_message(13, None, value, headers), GPU, 0, 13), "keyless, as the old publisher could send"


def test_a_record_dead_lettered_under_the_new_rules_still_matches_its_dead_letter(writer: TableWriter) -> None:
    """The identity check decodes leniently; a record this sink dead-lettered has no rows but its dead letter."""
    events = [gpu_health(ts_ns=T0 + 10 * 365 * 86_400 * 10**9)]
    key, value, headers = encode_batch(events)
    batch = PartitionBatch(BY_NAME["deadletter"], 0)
    batch.add(9, [dead_letter(GPU, 0, 25, key, value, "event 0: ts_ns ahead", "sink")])
    writer.insert(batch)
    sink = _sink(writer)
    assert sink._matches(_message(25, key, value, headers), GPU, 0, 25)
    assert not sink._matches(_message(26, key, value, headers), GPU, 0, 26), "no rows, no dead letter: differs"
