"""The sink's Kafka side: consume, decode, batch, insert, then commit.

Exactly-once into ClickHouse comes from two rules:
- offsets are committed only after every pending batch is inserted;
- on assignment, each partition resumes after the highest `_offset` already
  stored in its table (or the committed offset, whichever is later), so rows
  inserted just before a crash are not inserted again.
A retried insert reuses its dedup token, which covers a lost insert reply.
"""

from __future__ import annotations

import logging
import socket
import threading

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, Producer, TopicPartition

from schemas.codec import DecodeError, bounded, dead_letter, decode_batch, encode_batch
from schemas.kafka_security import KafkaSecurity
from schemas.topics import BY_NAME, TOPICS
from sinks.clickhouse import metrics
from sinks.clickhouse.batch_set import BatchSet, FlushPolicy
from sinks.clickhouse.table_writer import TableWriter

log = logging.getLogger(__name__)
RDKAFKA_LOG = logging.getLogger("rdkafka")  # librdkafka's own log lines, through Python logging
DEADLETTER_TOPIC = "deadletter"


class KafkaClickHouseSink:
    """Consumes `topics` into their ClickHouse tables."""

    def __init__(self, bootstrap: str, writer: TableWriter, topics: list[str] | None = None,
                 group_id: str = "clocktower-sink", policy: FlushPolicy | None = None,
                 instance_id: str | None = None, security: KafkaSecurity | None = None) -> None:
        self.writer = writer
        self.topics = topics or [t.name for t in TOPICS]
        self.batches = BatchSet(policy)
        login = (security or KafkaSecurity()).librdkafka()   # CLOCKTOWER_KAFKA_* SASL/mTLS
        self.rows_inserted = 0
        self.deadlettered = 0
        self.consumer = Consumer({
            "bootstrap.servers": bootstrap,
            "group.id": group_id,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000,  # the lowest noida-db accepts: a killed sink is replaced sooner
            "fetch.wait.max.ms": 100,
            # Also the rebalance timeout: how long a join waits for a member that died without leaving.
            "max.poll.interval.ms": 10000,
            # Static membership: a sink restarted after a crash takes over its old partitions at
            # once instead of waiting for a rebalance (noida-db never completes that one).
            "group.instance.id": instance_id or f"{group_id}-{socket.gethostname()}",
            "logger": RDKAFKA_LOG,
            **login,
        })
        self.producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                                  "linger.ms": 5, "compression.type": "lz4",
                                  "log.connection.close": False, "logger": RDKAFKA_LOG, **login})

    # --- partition assignment -------------------------------------------------
    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        committed = {(tp.topic, tp.partition): tp.offset for tp in consumer.committed(partitions, timeout=10)}
        stored: dict[str, dict[int, int]] = {}
        for tp in partitions:
            if tp.topic not in stored:
                stored[tp.topic] = self.writer.resume_offsets(BY_NAME[tp.topic])
            candidates = [o for o in (committed.get((tp.topic, tp.partition), -1),
                                      stored[tp.topic].get(tp.partition, -1)) if o >= 0]
            tp.offset = max(candidates) if candidates else OFFSET_BEGINNING
        log.info("assigned %s", [(tp.topic, tp.partition, tp.offset) for tp in partitions])
        consumer.assign(partitions)
        # Rows stored before a crash but never committed: commit them now, so the group's lag is true.
        ahead = [tp for tp in partitions
                 if tp.offset >= 0 and tp.offset > committed.get((tp.topic, tp.partition), -1)]
        if ahead:
            consumer.commit(offsets=[TopicPartition(tp.topic, tp.partition, tp.offset) for tp in ahead],
                            asynchronous=False)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.flush()
        consumer.unassign()

    # --- the loop ---------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        self.consumer.subscribe(self.topics, on_assign=self._on_assign, on_revoke=self._on_revoke)
        try:
            while not stop.is_set():
                for msg in self.consumer.consume(num_messages=2000, timeout=0.1):
                    self._handle(msg)
                    self.flush(due_only=True)  # per record: a batch never grows past max_rows + one record
                self.flush(due_only=True)
            self.flush()
        finally:
            self.producer.flush(10)
            self.consumer.close()

    def _handle(self, msg: Message) -> None:
        """Batch one record or dead-letter it: no record, whatever it holds, stops the sink."""
        err = msg.error()
        if err is not None:
            if err.code() != KafkaError._PARTITION_EOF:
                log.warning("consumer error: %s", err)
            return
        topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
        metrics.RECORDS.labels(topic).inc()
        try:
            batch = decode_batch(topic, msg.key(), msg.value(), msg.headers())
            self.batches.add(topic, partition, offset, batch.events)
            return
        except DecodeError as exc:
            reason = str(exc)
        except Exception as exc:  # noqa: BLE001 - a bug or an odd record: that record only is rejected
            log.exception("record %s[%d]@%d could not be batched", topic, partition, offset)
            reason = f"sink error: {type(exc).__name__}: {exc}"
        self._dead_letter(topic, partition, offset, msg.key(), msg.value(), reason)
        self.batches.skip(topic, partition, offset)

    def _dead_letter(self, topic: str, partition: int, offset: int, key: bytes | None,
                     value: bytes | None, reason: str) -> None:
        self.deadlettered += 1
        metrics.DEADLETTERS.labels(topic).inc()
        log.warning("deadletter %s[%d]@%d: %s", topic, partition, offset, bounded(reason, 500))
        if topic == DEADLETTER_TOPIC:
            return  # never loop: a broken dead letter is logged and counted only
        try:
            k, v, h = encode_batch([dead_letter(topic, partition, offset, key, value, reason, "sink")])
            for _ in range(100):   # a full queue drains as deliveries complete
                try:
                    self.producer.produce(DEADLETTER_TOPIC, key=k, value=v, headers=h)
                    break
                except BufferError:
                    self.producer.poll(0.1)
            else:
                raise BufferError("producer queue still full after 10 s")
        except Exception:  # noqa: BLE001 - the record is skipped either way; say so and count it
            metrics.DEADLETTER_FAILURES.labels(topic).inc()
            log.exception("dead letter for %s[%d]@%d could not be built or queued; skipped", topic, partition, offset)

    def flush(self, due_only: bool = False) -> None:
        """Insert the due (or all) batches, make dead letters durable, then commit their offsets."""
        keys = self.batches.due_keys() if due_only else None
        if keys == []:
            return
        batches, offsets = self.batches.take(keys)
        if not offsets:
            return
        with metrics.FLUSH_SECONDS.time():
            for batch in batches:
                self.writer.insert(batch)
                self.rows_inserted += batch.rows
                metrics.ROWS.labels(batch.spec.table).inc(batch.rows)
            if self.producer.flush(30) != 0:
                raise RuntimeError("dead letters not delivered; not committing")
            self.consumer.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()],
                                 asynchronous=False)
