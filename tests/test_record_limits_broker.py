"""Against the embedded broker (noida-db): the record size limit holds end to end, and typo'd topics are not created.

Measured on noida-db 0.2.3: a topic gets `max.message.bytes` 1048588 unless created with its own; the broker
checks it against the compressed record batch (MSG_SIZE_TOO_LARGE at delivery). Per-topic
`max.message.bytes` is honoured at creation and by IncrementalAlterConfigs; the broker's
`auto.create.topics.enable` is true by default, can be set to false with IncrementalAlterConfigs on the
broker resource, and stays false after a restart (kept in kafka.json).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from clocktower.producers.kafka_publisher import KafkaPublisher
from clocktower.producers.spooling_publisher import SpoolingPublisher
from clocktower.schemas.codec import decode_batch, encode_batch
from clocktower.schemas.operations import DeadLetter
from clocktower.schemas.telemetry import LinkState
from clocktower.schemas.topics import MAX_MESSAGE_BYTES, MAX_RECORD_BYTES, TOPICS
from clocktower.topic_admin import ensure_topics
from tests.standalone_broker import StandaloneBroker

TYPO = "telemetry.iteration"   # the registry has telemetry.iterations


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneBroker]:
    b = StandaloneBroker(tmp_path_factory.mktemp("limits") / "kafka")
    b.start()
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    # An existing topic made with the broker's defaults, as by an earlier version: its limit must be raised.
    admin.create_topics([NewTopic("telemetry.gpu", 2, 1)])["telemetry.gpu"].result(15)
    ensure_topics(b.bootstrap, disable_auto_create=True)
    try:
        yield b
    finally:
        b.stop()


def _topic_limit(admin: AdminClient, topic: str) -> int:
    (fut,) = admin.describe_configs([ConfigResource("topic", topic)]).values()
    return int(fut.result(10)["max.message.bytes"].value)


def _read_all(bootstrap: str, topic: str, expect_events: int, timeout: float = 20) -> list:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{topic}", "enable.auto.commit": False})
    try:
        meta = c.list_topics(topic, timeout=10).topics[topic]
        c.assign([TopicPartition(topic, p, 0) for p in meta.partitions])
        msgs, events, deadline = [], 0, time.monotonic() + timeout
        while events < expect_events and time.monotonic() < deadline:
            for m in c.consume(100, timeout=0.5):
                if m.error() is None:
                    msgs.append(m)
                    events += int(dict(m.headers())["ct-count"])
        return msgs
    finally:
        c.close()


def test_every_topic_accepts_the_record_limit(broker: StandaloneBroker) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    assert {t.name: _topic_limit(admin, t.name) for t in TOPICS} == {t.name: MAX_MESSAGE_BYTES for t in TOPICS}


def test_2_45_mib_of_events_land_as_several_decodable_records_none_lost(broker: StandaloneBroker) -> None:
    t0 = time.time_ns()
    # Hex interface names: little for lz4 to squeeze, so the broker sees records near their real size.
    events = [LinkState(node="node-big", ts_ns=t0 + i, interface=os.urandom(100).hex(), kind="ethernet", up=True,
                        carrier_changes=i, speed_mbps=400_000, operstate="up", carrier=True) for i in range(4600)]
    assert len(encode_batch(events)[1]) > 2.45 * 2**20
    pub = KafkaPublisher(broker.bootstrap, max_events_per_record=100_000, node_key=b"")
    records = pub.publish(events)
    assert pub.flush(30) == 0
    assert records >= 3
    assert (pub.acked["link_state"], pub.failed["link_state"], pub.refused["link_state"]) == (4600, 0, 0), pub.errors
    msgs = _read_all(broker.bootstrap, "telemetry.links", 4600)
    assert len(msgs) == records
    got = []
    for m in msgs:
        assert len(m.value()) <= MAX_RECORD_BYTES
        got += decode_batch("telemetry.links", m.key(), m.value(), m.headers()).events
    assert sorted(got, key=lambda e: e.ts_ns) == events


def test_an_event_too_big_alone_is_refused_and_counted_the_rest_delivered(broker: StandaloneBroker) -> None:
    now = time.time_ns()
    events = [DeadLetter(node="node-dl", ts_ns=now + i, origin_topic="telemetry.links", origin_partition=0,
                         origin_offset=i, reason="r", detector="test",
                         raw_b64="A" * (2 * MAX_RECORD_BYTES if i == 1 else 8)) for i in range(3)]
    pub = KafkaPublisher(broker.bootstrap, node_key=b"")
    assert pub.publish(events) >= 1
    assert pub.flush(30) == 0
    assert (pub.acked["deadletter"], pub.refused["deadletter"]) == (2, 1)
    assert "more than a record holds" in pub.errors[0]
    msgs = _read_all(broker.bootstrap, "deadletter", 2)
    assert [e.origin_offset for m in msgs for e in decode_batch("deadletter", m.key(), m.value(), m.headers()).events] \
        == [0, 2]


def test_a_typo_topic_is_not_created(broker: StandaloneBroker) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    with pytest.raises(ValueError, match="unknown topic"):
        KafkaPublisher(broker.bootstrap, node_key=b"").publish_raw(TYPO, b"n", b"[]", [])
    # A third-party producer with librdkafka's defaults (it asks for auto-creation).
    errors: list = []
    p = Producer({"bootstrap.servers": broker.bootstrap, "message.timeout.ms": 3000})
    p.produce(TYPO, key=b"n", value=b"[]", on_delivery=lambda err, msg: errors.append(err))
    p.flush(10)
    assert errors and errors[0] is not None
    assert TYPO not in admin.list_topics(timeout=10).topics


def test_auto_creation_stays_off_after_a_restart(broker: StandaloneBroker) -> None:
    broker.stop()
    broker.start()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    (broker_id,) = admin.list_topics(timeout=10).brokers
    (fut,) = admin.describe_configs([ConfigResource("broker", str(broker_id))]).values()
    assert fut.result(10)["auto.create.topics.enable"].value == "false"


def test_a_record_over_the_producer_limit_does_not_block_the_spool(broker: StandaloneBroker, tmp_path: Path) -> None:
    """librdkafka refuses it at produce(): rejected for good, as a broker refusal is, and the records behind go on."""
    results: list = []
    with SpoolingPublisher(broker.bootstrap, tmp_path / "spool") as pub:
        big = b"[" + b" " * MAX_MESSAGE_BYTES + b"]"      # as from an older version's spool or a raw caller
        pub.publish_raw("telemetry.links", b"node-s", big, [], on_delivery=lambda err, _m: results.append(err))
        pub.publish([_link_state("node-s", time.time_ns())])
        assert pub.flush(15) == 0
        deadline = time.monotonic() + 15
        while pub.spool.pending_records and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pub.spool.pending_records == 0
        assert pub.acked["link_state"] == 1 and pub.rejected_records == 1
        assert len(results) == 1 and results[0] is not None and results[0].code() == KafkaError.MSG_SIZE_TOO_LARGE


def _link_state(node: str, ts_ns: int) -> LinkState:
    return LinkState(node=node, ts_ns=ts_ns, interface="eth0", kind="ethernet", up=True, carrier_changes=0,
                     speed_mbps=400_000, operstate="up", carrier=True)
