"""The sink's Kafka side: consume, decode, batch, insert, then commit.

Exactly-once into ClickHouse comes from two rules:
- offsets are committed only after every pending batch is inserted;
- on assignment, each (topic, partition) resumes after the highest `_offset` of
  it already stored (or the committed offset, whichever is later), so rows
  inserted just before a crash are not inserted again; past the log end, the
  broker lost records, and the sink says so and resumes at the end (resume.py).
A retried insert reuses its dedup token, which covers a lost insert reply.
"""

from __future__ import annotations

import logging
import socket
import threading

from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition

from schemas.codec import DecodeError, bounded, dead_letter, decode_batch, encode_batch
from schemas.kafka_security import KafkaSecurity
from schemas.topics import BY_NAME, TOPICS
from sinks.clickhouse import metrics
from sinks.clickhouse.batch_set import BatchSet, FlushPolicy
from sinks.clickhouse.resume import ResumePoint, first_reused_offset, resume_point
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
        self._group_id = group_id
        self._probe_config = {"bootstrap.servers": bootstrap, "enable.auto.commit": False, "logger": RDKAFKA_LOG,
                              **login}
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
        stored: dict[tuple[str, int], int] = {}
        for topic in {tp.topic for tp in partitions}:
            stored |= self.writer.resume_offsets(BY_NAME[topic])
        reset = []
        for tp in partitions:
            key = (tp.topic, tp.partition)
            _, log_end = consumer.get_watermark_offsets(tp, timeout=10)
            point = resume_point(committed.get(key, -1), stored.get(key, -1), log_end)
            if point.lost:
                first_new = self._first_reused(tp, log_end)
                metrics.LOST_RECORDS.labels(tp.topic).inc(point.lost_count)
                log.error("%s[%d]: the log ends at %d, but records up to %d were stored or committed: the broker lost "
                          "at least %d acknowledged records and gave their offsets to new records from %d on. "
                          "Resuming at %d; the stored rows of lost records are kept with _offset = -1 - offset.",
                          tp.topic, tp.partition, log_end, log_end + point.lost_count - 1, point.lost_count,
                          first_new, first_new)
                self.writer.retire_offsets(BY_NAME[tp.topic], tp.partition, first_new)
                point = ResumePoint(first_new, lost=True)
                reset.append(tp)
            tp.offset = point.offset
        log.info("assigned %s", [(tp.topic, tp.partition, tp.offset) for tp in partitions])
        consumer.assign(partitions)
        # Rows stored before a crash but never committed: commit them now, so the group's lag is true.
        # After a loss, commit the log end (lower than the committed offset) so no later start skips ahead.
        ahead = [tp for tp in partitions
                 if tp in reset or (tp.offset >= 0 and tp.offset > committed.get((tp.topic, tp.partition), -1))]
        if ahead:
            consumer.commit(offsets=[TopicPartition(tp.topic, tp.partition, tp.offset) for tp in ahead],
                            asynchronous=False)

    def _first_reused(self, tp: TopicPartition, log_end: int) -> int:
        """After a broker loss: the first offset whose record is not the one stored at that offset."""
        spec = BY_NAME[tp.topic]
        probe = Consumer({**self._probe_config, "group.id": f"{self._group_id}-probe"})
        try:
            low, _ = probe.get_watermark_offsets(tp, timeout=10)

            def same(offset: int) -> bool:
                probe.assign([TopicPartition(tp.topic, tp.partition, offset)])
                msgs = [m for m in probe.consume(num_messages=1, timeout=5) if m.error() is None]
                if not msgs:
                    return True   # nothing there to compare: count it as kept
                m = msgs[0]
                try:
                    events = decode_batch(tp.topic, m.key(), m.value(), m.headers()).events
                except DecodeError:
                    return self.writer.dead_lettered(tp.topic, tp.partition, offset)
                return self.writer.stored_record(spec, tp.partition, offset) == (len(events),
                                                                                 min(e.ts_ns for e in events))

            return first_reused_offset(max(low, 0), log_end, same)
        finally:
            probe.close()

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
            self.batches.add(topic, partition, offset, batch.events, msg.value())
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
