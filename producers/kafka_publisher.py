"""The Kafka publisher every producer uses (node agent and simulator alike).

Events are grouped into records of one schema from one node (the batch
envelope), compressed, and sent with idempotence on; delivery callbacks
count what the broker acknowledged and what failed. A batch too big for one
record (MAX_RECORD_BYTES) goes as several; an event too big on its own is
refused, logged and counted in `refused`. Only registry topics are written,
and never auto-created: a typo'd topic fails instead of swallowing records.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable
from itertools import groupby

from confluent_kafka import KafkaError, KafkaException, Producer

from clocktower.runtime.local_signing import local_producer_key
from clocktower.schemas.batch_split import EncodedRecord, encode_records
from clocktower.schemas.event import Event
from clocktower.schemas.kafka_security import KafkaSecurity
from clocktower.schemas.record_mac import NodeSigning, node_key, sign
from clocktower.schemas.topics import BY_NAME, MAX_MESSAGE_BYTES, MAX_RECORD_BYTES, topic_for

log = logging.getLogger(__name__)


def check_topic(topic: str) -> None:
    """Refuse a topic the registry does not know (a typo would otherwise wait on metadata, then fail late)."""
    if topic not in BY_NAME:
        raise ValueError(f"unknown topic {topic!r}: not in the topic registry (schemas/topics.py)")


class KafkaPublisher:
    """Batches events into envelope records and publishes them."""

    def __init__(self, bootstrap: str, max_events_per_record: int = 1000, compression: str = "lz4",
                 extra_config: dict[str, object] | None = None, security: KafkaSecurity | None = None,
                 node_key: bytes | None = None, producer_key: bytes | None = None) -> None:
        """`producer_key` makes this a publisher for many nodes (the demo's simulated fleet): each record is signed
        with the key of the node it is keyed by, derived from it. A node's own publisher gets only `node_key`."""
        self.max_events = max_events_per_record
        self.max_record_bytes = MAX_RECORD_BYTES     # the records' value limit (schemas/topics.py)
        # Records are signed with this node's key (CLOCKTOWER_NODE_KEY) so the streams can check who sent them.
        # A fleet publisher (producer_key) never takes this host's CLOCKTOWER_NODE_KEY: it would sign every node's
        # records with one node's key. Without either, a publisher beside `up` signs with `up`'s key
        # (runtime/local_signing.py).
        if node_key is None and producer_key is None:
            node_key = NodeSigning().node_key_bytes()
            if node_key is None:
                producer_key = local_producer_key(bootstrap)
        self.node_key = node_key
        self.producer_key = producer_key
        self._node_keys: dict[bytes, bytes] = {}   # record key -> its node's key (producer_key only)
        self.acked: Counter[str] = Counter()     # events acknowledged, per schema
        self.failed: Counter[str] = Counter()    # events whose delivery failed, per schema
        self.sent: Counter[str] = Counter()      # events handed to the producer, per schema
        self.refused: Counter[str] = Counter()   # events too big for a record on their own, per schema
        self.errors: list[str] = []
        config: dict[str, object] = {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 20,
            "batch.size": 1_000_000,
            "compression.type": compression,
            "queue.buffering.max.kbytes": 512 * 1024,
            "message.max.bytes": MAX_MESSAGE_BYTES,      # what the topics accept (schemas/topics.py)
            "allow.auto.create.topics": False,
            "log.connection.close": False,
            "logger": logging.getLogger("rdkafka"),  # librdkafka's log lines, through Python logging
        }
        config.update((security or KafkaSecurity()).librdkafka())   # CLOCKTOWER_KAFKA_* SASL/mTLS login
        config.update(extra_config or {})
        self.producer = Producer(config)

    def publish(self, events: Iterable[Event]) -> int:
        """Queue `events` (any mix of schemas and nodes); returns records queued."""
        records = 0
        keyfunc = lambda e: (type(e).SCHEMA, e.node)  # noqa: E731
        for _, group in groupby(sorted(events, key=keyfunc), key=keyfunc):
            chunk = list(group)
            for i in range(0, len(chunk), self.max_events):
                records += self.publish_batch(chunk[i:i + self.max_events])
        return records

    def publish_batch(self, events: list[Event]) -> int:
        """Queue one pre-grouped batch (one schema, one node): one record, or several if it is too big.

        Returns the records queued. An event too big for a record on its own is refused: logged and
        counted in `refused`, never sent."""
        topic = topic_for(type(events[0])).name
        schema = type(events[0]).SCHEMA
        split = encode_records(events, self.max_record_bytes)
        for event, size in split.oversized:
            self.refused[schema] += 1
            msg = (f"refused a {schema} event of node {event.node!r} at ts_ns {event.ts_ns}: {size} bytes encoded, "
                   f"more than a record holds ({self.max_record_bytes})")
            self.errors.append(msg)
            log.error("%s", msg)
        for rec in split.records:
            self.send_record(topic, schema, rec)
        return len(split.records)

    def send_record(self, topic: str, schema: str, rec: EncodedRecord) -> None:
        """Sign and queue one encoded record, counting its events as sent and, on delivery, acked or failed."""
        key, value, headers = self.signed(topic, rec.key, rec.value, rec.headers)
        n = rec.events

        def on_delivery(err: KafkaError | None, _msg: object) -> None:
            if err is None:
                self.acked[schema] += n
            else:
                self.failed[schema] += n
                self.errors.append(str(err))
                log.error("delivery of %d %s events failed: %s", n, schema, err)

        self.publish_raw(topic, key, value, headers, on_delivery)
        self.sent[schema] += n

    def signed(self, topic: str, key: bytes, value: bytes, headers: list) -> tuple[bytes, bytes, list]:
        """The record with its node's MAC header added, when the publisher has a node (or the producer) key."""
        key_for_node = self.node_key
        if key_for_node is None and self.producer_key is not None:
            key_for_node = self._node_keys.get(key)
            if key_for_node is None:
                key_for_node = self._node_keys[key] = node_key(self.producer_key, key.decode("utf-8", "replace"))
        return key, value, sign(key_for_node, topic, key, value, headers) if key_for_node else headers

    def publish_raw(self, topic: str, key: bytes | None, value: bytes, headers: list | None = None,
                    on_delivery=None) -> None:  # noqa: ANN001
        """Produce one already-encoded record, waiting for queue space when full."""
        check_topic(topic)
        while True:
            try:
                self.producer.produce(topic, key=key, value=value, headers=headers, on_delivery=on_delivery)
                break
            except BufferError:
                self.producer.poll(0.05)
            except KafkaException as exc:
                raise RuntimeError(f"cannot publish to {topic}: {exc}") from exc
        self.producer.poll(0)

    def flush(self, timeout: float = 30.0) -> int:
        """Wait for outstanding deliveries; returns how many are still pending."""
        return self.producer.flush(timeout)
