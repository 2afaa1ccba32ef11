"""The sink's Kafka side: consume, decode, batch, insert, then commit.

Exactly-once into ClickHouse comes from two rules: offsets are committed only after every
pending batch is inserted, and each (topic, partition) resumes after the later of its committed
offset and its highest stored `_offset`, so rows inserted just before a crash are not inserted again.
Inserts run on one thread, in order, while the next records are decoded (insert_queue.py): a failed one
stops every later one, so the highest stored offset never passes a record whose rows are missing.
When the broker lost acknowledged records and reused their offsets (the embedded noida-db does after
a kill -9), the sink finds the first reused offset on assignment or on an out-of-range fetch,
deletes the rows stored from it on and reads the log again from there (resume.py), so
the tables mirror the log: producers that hold acks (the agent, PyTorch hooks) resend what was lost.
A check the broker does not answer (or one past the search budget) is no loss, but no answer either: that
partition stays paused, is not read, and is checked again after a bounded backoff until the check answers;
the other partitions go on meanwhile.
Not caught: a log refilled past a running sink's fetch position before its next fetch (no error, no
reassignment): new records below that position are skipped, the lost ones' rows kept.
A retried insert reuses its dedup token, which covers a lost insert reply; the token's salt is renewed
after every delete, so records read again after it are stored again.
"""

from __future__ import annotations

import logging
import secrets
import socket
import threading
import time
from collections.abc import Callable, Mapping

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from clocktower.runtime.consume_loop import commit, consume_loop
from clocktower.runtime.idle_pacer import CONSUMER_SETTINGS as IDLE_CONSUMER_SETTINGS
from clocktower.runtime.idle_pacer import IDLE_FETCH_BACKOFF_S
from clocktower.schemas.codec import (
    DEFAULT_MAX_FUTURE_SKEW_NS,
    DecodeError,
    bounded,
    dead_letter,
    decode_batch,
    decode_columns,
    encode_batch,
)
from clocktower.schemas.kafka_security import KafkaSecurity
from clocktower.schemas.record_mac import node_mac_status
from clocktower.schemas.topics import BY_NAME, NODE_SIGNED_TOPICS, TOPICS
from clocktower.sinks.clickhouse import metrics
from clocktower.sinks.clickhouse.batch_set import BatchSet, FlushPolicy
from clocktower.sinks.clickhouse.insert_queue import InsertQueue
from clocktower.sinks.clickhouse.partition_batch import PartitionBatch
from clocktower.sinks.clickhouse.resume import OFFSET_BEGINNING, ResumePoint, find_resume, known_resume
from clocktower.sinks.clickhouse.table_writer import TableWriter

log = logging.getLogger(__name__)
GROUP_ID = "clocktower-sink"
RDKAFKA_LOG = logging.getLogger("rdkafka")  # librdkafka's own log lines, through Python logging
DEADLETTER_TOPIC = "deadletter"
# The resume checks run inside the assign callback, which must return well within max.poll.interval.ms
# (10 s): committed() waits at most COMMITTED_TIMEOUT_S; the watermark look-ups, the checks below the resume
# points and the searches of one assignment together at most SEARCH_BUDGET_S (each probe try at most
# PROBE_TIMEOUT_S). Past it, unchecked partitions stay paused (WARNING; checked again after RECHECK_BACKOFF_S)
# and a search resumes at the end of the proven prefix (more is read again, nothing skipped).
# The ClickHouse queries and deletes are not bounded by it.
PROBE_TRIES = 3
PROBE_TIMEOUT_S = 0.5
SEARCH_BUDGET_S = 4.0
COMMITTED_TIMEOUT_S = 3.0
WATERMARK_TIMEOUT_S = 1.0
RECHECK_BACKOFF_S = (0.5, 10.0)   # a failed or unanswered check is retried after this, doubling up to the maximum


class KafkaClickHouseSink:
    """Consumes `topics` into their ClickHouse tables."""

    def __init__(self, bootstrap: str, writer: TableWriter, topics: list[str] | None = None,
                 group_id: str = GROUP_ID, policy: FlushPolicy | None = None,
                 instance_id: str | None = None, security: KafkaSecurity | None = None,
                 max_future_skew_ns: int = DEFAULT_MAX_FUTURE_SKEW_NS, idle_backoff_s: float = IDLE_FETCH_BACKOFF_S,
                 check_reused_offsets: bool = True, consumer_extra: Mapping[str, object] | None = None,
                 producer_key: bytes | None = None, trickle_backoff_s: float = 0.0) -> None:
        """`idle_backoff_s`, `trickle_backoff_s`, `check_reused_offsets` and `consumer_extra` (librdkafka settings)
        make up for the embedded broker (runtime/broker_profile.py); the sink's main passes the broker profile's. With
        `producer_key` (CLOCKTOWER_PRODUCER_KEY), each row of a node-signed topic says whether its node signed it."""
        self.producer_key = producer_key
        self.writer = writer
        self.idle_backoff_s = idle_backoff_s
        self.trickle_backoff_s = trickle_backoff_s
        self.check_reused_offsets = check_reused_offsets
        self.max_future_skew_ns = max_future_skew_ns   # CLOCKTOWER_MAX_FUTURE_SKEW_S
        self.topics = topics or [t.name for t in TOPICS]
        self.batches = BatchSet(policy, salt=secrets.token_hex(4))
        self.inserts = InsertQueue(_inserter(writer))   # inserts overlap the next records' decoding
        login = (security or KafkaSecurity()).librdkafka()   # CLOCKTOWER_KAFKA_* SASL/mTLS
        self._group_id = group_id
        extra = dict(consumer_extra or {})
        self._probe_config = {"bootstrap.servers": bootstrap, "enable.auto.commit": False, "logger": RDKAFKA_LOG,
                              **extra, **login}
        self.deadlettered = 0
        self._recheck_at: float | None = None   # when to retry a failed or unanswered check (None: none pending)
        self._pending: set[tuple[str, int]] = set()  # assigned but paused: their check has not answered yet
        self._next: dict[tuple[str, int], int] = {}  # next offset to handle of each assigned partition
        self._recheck_backoff = RECHECK_BACKOFF_S[0]
        self.consumer = Consumer({
            "bootstrap.servers": bootstrap,
            "group.id": group_id,
            "enable.auto.commit": False,
            # Never rewind silently: an out-of-range fetch (the broker lost records under us) comes back as
            # _AUTO_OFFSET_RESET and goes through the same loss path as an assignment.
            "auto.offset.reset": "error",
            "session.timeout.ms": 6000,  # the lowest noida-db accepts: a killed sink is replaced sooner
            "fetch.wait.max.ms": 100,
            # Also the rebalance timeout: how long a join waits for a member that died without leaving.
            "max.poll.interval.ms": 10000,
            # Static membership: a sink restarted after a crash takes over its old partitions at
            # once instead of waiting for a rebalance (noida-db never completes that one).
            "group.instance.id": instance_id or f"{group_id}-{socket.gethostname()}",
            "logger": RDKAFKA_LOG,
            **IDLE_CONSUMER_SETTINGS,   # the broker answers fetches at once: an idle sink pauses (idle_pacer.py)
            **extra,
            **login,
        })
        self.producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                                  "linger.ms": 5, "compression.type": "lz4",
                                  "log.connection.close": False, "logger": RDKAFKA_LOG, **login})

    @property
    def rows_inserted(self) -> int:
        return self.inserts.rows

    # --- partition assignment -------------------------------------------------
    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition],
                   checked: frozenset[tuple[str, int]] = frozenset()) -> None:
        """Check and assign `partitions`; those in `checked` (already checked, consuming) resume at once.

        A partition whose check gives no answer is assigned paused and kept in the pending set: it is not read
        until a later check answers, as resuming it unchecked could skip records whose rows an earlier check
        deleted (its commit lost) or that a broker loss gave to new records.
        """
        # Inserts in flight land first: the checks below read (and may delete) what is stored. Their offsets need no
        # commit here: the resume point covers rows stored and not committed. A failed insert raises: retried.
        self.inserts.finished(wait=True)
        committed = {(tp.topic, tp.partition): tp.offset
                     for tp in consumer.committed(partitions, timeout=COMMITTED_TIMEOUT_S)}
        stored: dict[tuple[str, int], int] = {}
        for topic in {tp.topic for tp in partitions}:
            stored |= self.writer.resume_offsets(BY_NAME[topic])
        reset, waiting = [], []
        deadline = time.monotonic() + SEARCH_BUDGET_S
        probe = Consumer({**self._probe_config, "group.id": f"{self._group_id}-probe"})
        try:
            for tp in partitions:
                key = (tp.topic, tp.partition)
                if key in checked and key in self._next:   # checked, consuming: where it is (all before is stored;
                    tp.offset = self._next[key]           # its committed offset may be stale after a delete)
                    continue
                point, high = self._resume_point(consumer, probe, tp, committed.get(key, -1), stored.get(key, -1),
                                                 deadline)
                if point.unchecked:
                    log.warning("%s[%d]: the record below the resume point %d could not be fetched in time, so a loss "
                                "by the broker could not be checked; paused, checked again in %.1f s", tp.topic,
                                tp.partition, point.offset, self._recheck_backoff)
                    waiting.append(tp)
                if point.lost:
                    self._forget_lost(tp, point, high)
                    reset.append(tp)
                tp.offset = point.offset
        finally:
            probe.close()
        log.info("assigned %s", [(tp.topic, tp.partition, tp.offset) for tp in partitions])
        self._next |= {(tp.topic, tp.partition): tp.offset for tp in partitions}
        consumer.assign(partitions)
        if waiting:
            consumer.pause(waiting)
        self._pending = {(tp.topic, tp.partition) for tp in waiting}
        consumer.resume([tp for tp in partitions if (tp.topic, tp.partition) not in self._pending])  # an earlier pause
        if waiting:
            self._schedule_recheck()
        else:
            self._recheck_at, self._recheck_backoff = None, RECHECK_BACKOFF_S[0]
        # Rows stored before a crash but never committed: commit them now, so the group's lag is true.
        # After a loss, commit the first reused offset (lower than the committed one) so no later start skips ahead.
        ahead = [tp for tp in partitions if (tp.topic, tp.partition) not in self._pending and
                 (tp in reset or (tp.offset >= 0 and tp.offset > committed.get((tp.topic, tp.partition), -1)))]
        if ahead:
            try:
                consumer.commit(offsets=[TopicPartition(tp.topic, tp.partition, tp.offset) for tp in ahead],
                                asynchronous=False)
            except KafkaException as exc:   # e.g. a stale generation after a broker restart: the next flush commits,
                log.warning("commit on assignment failed (%s); the next flush commits", exc)  # and a stale
                # committed offset is caught by the check below the resume point on the next assignment

    def _resume_point(self, consumer: Consumer, probe: Consumer, tp: TopicPartition, committed: int, stored: int,
                      deadline: float) -> tuple[ResumePoint, int]:
        """The checked resume point of one partition and its log end, within `deadline`."""
        resume = known_resume(committed, stored)
        unchecked = ResumePoint(resume) if resume >= 0 else ResumePoint(OFFSET_BEGINNING)
        if not self.check_reused_offsets and resume < 0:
            return unchecked, -1
        try:
            timeout = min(WATERMARK_TIMEOUT_S, deadline - time.monotonic())
            if timeout <= 0:
                raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "search budget spent"))
            low, high = consumer.get_watermark_offsets(tp, timeout=timeout)
        except KafkaException as exc:   # no log bounds: nothing can be compared, so nothing is assumed lost
            if not self.check_reused_offsets:   # nor held back: a Kafka broker reuses no offset
                return unchecked, -1
            log.warning("%s[%d]: no log bounds (%s)", tp.topic, tp.partition, exc)
            return (ResumePoint(resume, unchecked=True) if resume >= 0 else ResumePoint(OFFSET_BEGINNING)), -1
        if not self.check_reused_offsets and low <= resume <= high:
            # a Kafka broker never gives an offset to a second record: only a resume point outside the log (a topic
            # made anew, an unclean leader election) is searched, as the embedded broker's are
            return unchecked, high
        point = find_resume(committed, stored, low, high,
                            lambda offset: self._same(probe, tp, offset, deadline),
                            budget_s=max(0.0, deadline - time.monotonic()))
        return point, high

    def _forget_lost(self, tp: TopicPartition, point: ResumePoint, high: int) -> None:
        """Delete the rows of records from `point.offset` on (not their dead letters), renew the salt, say so."""
        deleted = self.writer.delete_from(BY_NAME[tp.topic], tp.partition, point.offset)
        self.batches.salt = secrets.token_hex(4)   # the deleted batches' tokens must not drop their re-read
        lost = point.resume_was - point.first_different
        metrics.LOST_RECORDS.labels(tp.topic).inc(lost)
        metrics.DELETED_ROWS.labels(tp.topic).inc(deleted)
        log.error("%s[%d]: the broker lost acknowledged records: offsets %d..%d (%d records) no longer hold the "
                  "records stored or committed from them (log end now %d). Deleted their %d rows; reading again from "
                  "%d%s. Producers that hold acks resend what was lost; other records at those offsets are gone.",
                  tp.topic, tp.partition, point.first_different, point.resume_was - 1, lost, high, deleted,
                  point.offset, "" if point.certain else
                  f" (offsets {point.offset}..{point.first_different - 1} could not be compared: a probe went "
                  "unanswered or the search ran out of time; they are read again, not counted as lost)")

    def _same(self, probe: Consumer, tp: TopicPartition, offset: int, deadline: float) -> bool | None:
        """Whether the record at `offset` is the one stored from it; None when the broker does not hand it over."""
        for _ in range(PROBE_TRIES):
            timeout = min(PROBE_TIMEOUT_S, deadline - time.monotonic())
            if timeout <= 0:
                break
            probe.assign([TopicPartition(tp.topic, tp.partition, offset)])
            msgs = [m for m in probe.consume(num_messages=1, timeout=timeout)
                    if m.error() is None and m.offset() == offset]
            if msgs:
                return self._matches(msgs[0], tp.topic, tp.partition, offset)
        log.warning("%s[%d]@%d: the broker did not hand over the record in time; unknown", tp.topic,
                    tp.partition, offset)
        return None

    def _matches(self, m: Message, topic: str, partition: int, offset: int) -> bool:
        """Compare a record with its stored rows (count and first timestamp) or its dead letter.

        Decoded without the envelope rules (size, key, ct-count, event time): a record an earlier sink stored under
        older rules must still match its rows, or the check would call it lost and delete them. A record this sink
        dead-lettered under the rules has no rows and matches its dead letter.
        """
        try:
            events = decode_batch(topic, m.key(), m.value(), m.headers(), envelope_checks=False).events
        except DecodeError:
            return self.writer.dead_lettered(topic, partition, offset)
        stored = self.writer.stored_record(BY_NAME[topic], partition, offset)
        if stored is None:   # no rows: the same record if it had none, or if the sink dead-lettered it
            return not events or self.writer.dead_lettered(topic, partition, offset)
        return bool(events) and stored == (len(events), min(e.ts_ns for e in events))

    def _assigned(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """The rebalance callback: a failing check (broker just restarted) is retried like an out-of-range one."""
        try:
            self._on_assign(consumer, partitions)
        except Exception:  # noqa: BLE001 - an exception here would end run(): retried instead
            log.exception("the check on assignment failed; retrying in %.1f s", self._recheck_backoff)
            parts = [TopicPartition(tp.topic, tp.partition) for tp in partitions]
            try:
                consumer.assign(parts)   # assignment() is empty until assign(): assign first, then pause these
            except Exception:  # noqa: BLE001 - the retry assigns them again
                log.exception("assigning the partitions failed")
            self._retry_later(parts)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._recheck_at, self._pending = None, set()   # the next assignment checks whatever it gives
        try:
            self.flush()
        except Exception:  # noqa: BLE001 - never out of a librdkafka callback: nothing of it was committed, and the
            # next owner of these partitions resumes from the committed and stored offsets, reading them again
            log.exception("storing before the revoke failed; the records are read again from the last commit")
            self.batches.take()
            self.inserts.reset()
        consumer.unassign()

    # --- the loop (runtime/consume_loop.py) -----------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        self.consumer.subscribe(self.topics, on_assign=self._assigned, on_revoke=self._on_revoke)
        consume_loop(self.consumer, self, stop, backoff_s=self.idle_backoff_s, trickle_s=self.trickle_backoff_s)

    def held(self) -> set[tuple[str, int]]:
        """Partitions whose loss check has not answered: not read, and never resumed by the idle pacer."""
        return self._pending

    def before_consume(self) -> None:
        if self._recheck_at is not None and time.monotonic() >= self._recheck_at:
            self._check_after_out_of_range()

    def handle(self, msg: Message) -> bool:
        """Batch one record or dead-letter it; True when the fetch positions were reset (out of range)."""
        if self._handle(msg):
            return True
        if msg.error() is None:
            self._next[(msg.topic(), msg.partition())] = msg.offset() + 1
        return False

    def close(self) -> None:
        try:
            self.consumer.close()   # its revoke stores what is pending, through the insert thread
        finally:
            self.inserts.close()
            self.producer.flush(10)

    def _handle(self, msg: Message) -> bool:
        """Batch one record or dead-letter it: no record, whatever it holds, stops the sink.

        True when the fetch positions were reset (after an out-of-range fetch).
        """
        err = msg.error()
        if err is not None:
            if err.code() == KafkaError._AUTO_OFFSET_RESET:
                self._refetch_after_out_of_range(msg)
                return True
            if err.code() != KafkaError._PARTITION_EOF:
                log.warning("consumer error: %s", err)
            return False
        topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
        metrics.RECORDS.labels(topic).inc()
        try:
            value = msg.value()
            batch = decode_columns(topic, msg.key(), value, msg.headers(), max_future_skew_ns=self.max_future_skew_ns)
            headers = msg.headers() or []
            mac = node_mac_status(self.producer_key, topic, msg.key(), value, headers, NODE_SIGNED_TOPICS)
            self.batches.add_columns(topic, partition, offset, batch.rows, batch.columns, value or b"", mac)
            return False
        except DecodeError as exc:
            reason = str(exc)
        except Exception as exc:  # noqa: BLE001 - a bug or an odd record: that record only is rejected
            log.exception("record %s[%d]@%d could not be batched", topic, partition, offset)
            reason = f"sink error: {type(exc).__name__}: {exc}"
        self._dead_letter(topic, partition, offset, msg.key(), msg.value(), reason)
        self.batches.skip(topic, partition, offset)
        return False

    def _refetch_after_out_of_range(self, msg: Message) -> None:
        """The fetch position is past the log end: the broker lost records under us. Find where to go on."""
        log.error("%s[%d]: fetch out of range (%s); checking for lost records", msg.topic(), msg.partition(),
                  msg.error().str())
        self._pending |= self._assigned_keys()   # all are checked again
        self._check_after_out_of_range()

    def _check_after_out_of_range(self) -> None:
        """Store what is pending, then check the pending partitions as on assignment; the others resume as they were.

        Any failure (a broker just restarted, a failed insert) pauses the partitions and retries after a
        bounded backoff; the check resumes from the committed/stored offsets, so records whose batch was
        lost in a failed insert are read again. It never ends the sink.
        """
        try:
            try:
                self.flush()   # pending rows are stored first, so the resume check sees all of them
            except KafkaException as exc:   # the commit (e.g. a stale generation): the rows are stored, enough
                log.warning("commit before the loss check failed (%s)", exc)
            keys = self._assigned_keys() | self._pending
            parts = [TopicPartition(t, p) for t, p in sorted(keys)]
            self._on_assign(self.consumer, parts, frozenset(keys - self._pending))
        except Exception:  # noqa: BLE001 - retried: the sink never stops for it
            log.exception("the loss check failed; retrying in %.1f s", self._recheck_backoff)
            self._retry_later([TopicPartition(t, p) for t, p in sorted(self._assigned_keys() | self._pending)])

    def _assigned_keys(self) -> set[tuple[str, int]]:
        return {(tp.topic, tp.partition) for tp in self.consumer.assignment()}

    def _retry_later(self, partitions: list[TopicPartition]) -> None:
        """Drop pending batches and inserts (read again from the committed/stored offsets), pause `partitions`, check
        later."""
        self.batches.take()
        self.inserts.reset()
        self._pending |= {(tp.topic, tp.partition) for tp in partitions}   # their records are not handled meanwhile
        try:
            self.consumer.pause(partitions)   # no later record may be committed past them
        except Exception:  # noqa: BLE001 - the retry re-assigns anyway; their records are skipped until then
            log.exception("pausing the partitions failed")
        self._schedule_recheck()

    def _schedule_recheck(self) -> None:
        """Check the pending partitions again after the backoff, which doubles up to its maximum."""
        self._recheck_at = time.monotonic() + self._recheck_backoff
        self._recheck_backoff = min(2 * self._recheck_backoff, RECHECK_BACKOFF_S[1])

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
        commit(self.consumer, self.store(due_only))

    def store(self, due_only: bool = False, caught_up: bool = False) -> dict[tuple[str, int], int]:
        """Hand the due (or all) batches to the insert thread (sinks/clickhouse/insert_queue.py) and return the
        offsets now safe to commit: those whose inserts are done (every one unless `due_only`: this waits for them),
        once the dead letters are durable too. A failed insert raises here. `caught_up` (the last consume brought
        no record): with enough rows waiting, every batch is due (BatchSet.due_keys)."""
        keys = self.batches.due_keys(caught_up) if due_only else None
        if keys != []:
            batches, offsets = self.batches.take(keys)
            if offsets:
                self.inserts.submit(batches, offsets)
        done = self.inserts.finished(wait=not due_only)
        if not done:
            return {}
        if self.producer.flush(30) != 0:
            raise RuntimeError("dead letters not delivered; not committing")
        return done


def _inserter(writer: TableWriter) -> Callable[[PartitionBatch], None]:
    """Insert one batch, on the insert thread (a closure, not a method: the sink holds no reference cycle, so a
    dropped sink and its ClickHouse client go at once)."""
    def insert(batch: PartitionBatch) -> None:
        with metrics.FLUSH_SECONDS.time():
            writer.insert(batch)
        metrics.ROWS.labels(batch.spec.table).inc(batch.rows)
    return insert
