"""The Kafka publisher every producer uses (node agent and simulator alike).

Events are grouped into records of one schema from one node (the batch
envelope), compressed, and sent with idempotence on; delivery callbacks
count what the broker acknowledged and what failed.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable
from itertools import groupby

from clocktower.schemas.codec import encode_batch
from clocktower.schemas.event import Event
from clocktower.schemas.kafka_security import KafkaSecurity
from clocktower.schemas.record_mac import NodeSigning, sign
from clocktower.schemas.topics import topic_for
from confluent_kafka import KafkaError, KafkaException, Producer

log = logging.getLogger(__name__)


class KafkaPublisher:
    """Batches events into envelope records and publishes them."""

    def __init__(self, bootstrap: str, max_events_per_record: int = 1000, compression: str = "lz4",
                 extra_config: dict[str, object] | None = None, security: KafkaSecurity | None = None,
                 node_key: bytes | None = None) -> None:
        self.max_events = max_events_per_record
        # Records are signed with this node's key (CLOCKTOWER_NODE_KEY) so the streams can check who sent them.
        self.node_key = node_key if node_key is not None else NodeSigning().node_key_bytes()
        self.acked: Counter[str] = Counter()     # events acknowledged, per schema
        self.failed: Counter[str] = Counter()    # events whose delivery failed, per schema
        self.sent: Counter[str] = Counter()      # events handed to the producer, per schema
        self.errors: list[str] = []
        config: dict[str, object] = {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 20,
            "batch.size": 1_000_000,
            "compression.type": compression,
            "queue.buffering.max.kbytes": 512 * 1024,
            "message.max.bytes": 8 * 1024 * 1024,
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
                self.publish_batch(chunk[i:i + self.max_events])
                records += 1
        return records

    def publish_batch(self, events: list[Event]) -> None:
        """Queue one pre-grouped batch (one schema, one node) as one record."""
        key, value, headers = self.signed(topic_for(type(events[0])).name, *encode_batch(events))
        schema = type(events[0]).SCHEMA
        n = len(events)

        def on_delivery(err: KafkaError | None, _msg: object) -> None:
            if err is None:
                self.acked[schema] += n
            else:
                self.failed[schema] += n
                self.errors.append(str(err))
                log.error("delivery of %d %s events failed: %s", n, schema, err)

        self.publish_raw(topic_for(type(events[0])).name, key, value, headers, on_delivery)
        self.sent[schema] += n

    def signed(self, topic: str, key: bytes, value: bytes, headers: list) -> tuple[bytes, bytes, list]:
        """The record with this node's MAC header added, when the publisher has a node key."""
        return key, value, sign(self.node_key, topic, key, value, headers) if self.node_key else headers

    def publish_raw(self, topic: str, key: bytes | None, value: bytes, headers: list | None = None,
                    on_delivery=None) -> None:  # noqa: ANN001
        """Produce one already-encoded record, waiting for queue space when full."""
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
