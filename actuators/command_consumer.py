"""The actuator's Kafka side: read this node's partition of control.commands, hand each command to the Actuator,
publish its ack, then commit.

Commands are sent to the partition `partition_of(node, n)` of control.commands (schemas/partitioning.py), so the
consumer `assign()`s only that one (no subscribe, no rebalance: every node's actuator is alone in its group,
`clocktower-actuator-<node>`), re-reads the partition count every `metadata_refresh_s` and adds the new partition
of its node if the topic grew (the old one stays assigned: commands sent before the growth are still read).
A partition with no committed offset starts at the first record of the last command lifetime (offsets_for_times):
anything older has expired. With no record in that lifetime it starts at the high watermark read at that moment, an
absolute offset: the logical OFFSET_END would be resolved only at the first fetch, skipping for good a command
produced in between. Records of the other nodes sharing the partition are skipped, counted (`foreign`).

The loop is the sink's (runtime/consume_loop.py): the acks of the handled records are handed to `publish` (the
agent's spooling path) before their offsets are committed. A record that fails decoding is never applied: the
ids it names get `refused` acks; one naming none becomes a dead letter. No record stops the consumer. Refused
acks are published at most `REFUSED_ACKS_PER_S` a second (burst `REFUSED_ACKS_BURST`); the others are counted
(`refused_acks_dropped`) and logged, not published: 261k forged commands once made the actuator publish as many
refused acks, and genuine commands waited 44 s behind them (issue 18).

Nothing else stops it either: any exception out of the loop (a failed synchronous commit, a broker restarting) is
logged and counted (`loop_restarts`, `last_error`), and the consumer is rebuilt and resumes after a backoff (0.5 s
doubling to 10 s), until `stop`. A partition then restarts after the last record handled by this process when
that is past its committed offset (the records' acks are published, or still pending and published at the next
store; the offset is committed at that store), so an in-process restart applies and acks nothing twice. Limit: if
the process itself dies between publishing acks and committing their offsets, the next process reads those
records again, and the on-disk seen-commands memory refuses them as `replayed` (a second ack, `refused`, for an id
already acked `applied`; never a second apply).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, TopicPartition

from clocktower.actuators.actuator import Actuator
from clocktower.actuators.malformed import named_commands
from clocktower.control.command_check import MAX_LIFETIME_NS
from clocktower.runtime.broker_profile import PROFILES
from clocktower.runtime.consume_loop import Offsets, consume_loop
from clocktower.runtime.idle_pacer import CONSUMER_SETTINGS as IDLE_CONSUMER_SETTINGS
from clocktower.runtime.rate_limit import TokenBucket
from clocktower.schemas.codec import DecodeError, bounded, dead_letter, decode_batch
from clocktower.schemas.control import ControlCommand
from clocktower.schemas.event import Event
from clocktower.schemas.kafka_security import KafkaSecurity
from clocktower.schemas.partitioning import partition_of

log = logging.getLogger(__name__)
RDKAFKA_LOG = logging.getLogger("rdkafka")
TOPIC = "control.commands"
METADATA_REFRESH_S = 30.0
METADATA_TIMEOUT_S = 5.0
REFUSED_ACKS_PER_S = 20.0      # refused acks published per second at most, after a burst of REFUSED_ACKS_BURST
REFUSED_ACKS_BURST = 200.0
RETRY_S = (0.5, 10.0)         # assigning, and rebuilding after a failed loop: retried, doubling up to the maximum

Publish = Callable[[list[Event]], None]


def group_of(node: str) -> str:
    return f"clocktower-actuator-{node}"


class CommandConsumer:
    """Runs `actuator` on `node`'s commands until `run`'s stop is set; see the module doc."""

    def __init__(self, bootstrap: str, actuator: Actuator, publish: Publish, *, security: KafkaSecurity | None = None,
                 topic: str = TOPIC, metadata_refresh_s: float = METADATA_REFRESH_S,
                 clock: Callable[[], int] = time.time_ns, idle_backoff_s: float = 0.025,
                 consumer_extra: Mapping[str, object] | None = None) -> None:
        """`idle_backoff_s` and `consumer_extra` (librdkafka settings) are the broker profile's
        (runtime/broker_profile.py); the defaults are the embedded broker's."""
        self.node = actuator.node
        self.idle_backoff_s = idle_backoff_s   # what an idle actuator adds to a command's latency, at most
        self.actuator = actuator
        self.publish = publish
        self.topic = topic
        self.metadata_refresh_s = metadata_refresh_s
        self.clock = clock
        self.counts: Counter[str] = Counter()    # handled, foreign, malformed, deadlettered, acks_<status>, ...
        self.partitions: list[int] = []          # assigned, in the order they were added
        self._acks: list[Event] = []             # handled, not yet handed to publish
        self._refused_acks = TokenBucket(REFUSED_ACKS_PER_S, REFUSED_ACKS_BURST, clock())
        self._offsets: dict[tuple[str, int], int] = {}
        self._refresh_at = 0.0
        self._position: dict[tuple[str, int], int] = {}   # after the last record handled by this process
        self._assigned: set[int] = set()                    # partitions assigned to the current consumer
        self._retry_s = RETRY_S[0]
        self._lock = threading.Lock()
        self._alive = False
        self._restarts = 0
        self._last_error: str | None = None
        self._config = {
            "bootstrap.servers": bootstrap,
            "group.id": group_of(self.node),
            "enable.auto.commit": False,
            # A committed offset past the log end (the broker lost records) comes back as _AUTO_OFFSET_RESET and
            # restarts at the last command lifetime, not at the start of 90 days of retention.
            "auto.offset.reset": "error",
            "fetch.wait.max.ms": 100,
            "logger": RDKAFKA_LOG,
            **IDLE_CONSUMER_SETTINGS,          # the embedded broker answers fetches at once: pause while idle
            **(PROFILES["embedded"].librdkafka_consumer() if consumer_extra is None else consumer_extra),
            **(security or KafkaSecurity()).librdkafka(),
        }
        self.consumer = Consumer(self._config)
        self._open = True

    # -- running ---------------------------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Consume until `stop`, closing the consumer at the end; a failed loop is rebuilt (see the module doc)."""
        with self._lock:
            self._alive = True
        try:
            while not stop.is_set():
                started = time.monotonic()
                try:
                    self._run_once(stop)
                except Exception as exc:  # noqa: BLE001 - whatever ended the loop, the actuator goes on
                    self._failed(exc, time.monotonic() - started)
                    self._backoff(stop)
        finally:
            self._close_quietly()
            with self._lock:
                self._alive = False

    def _run_once(self, stop: threading.Event) -> None:
        """Assign (waiting for the broker and the topic), then run the consume loop until `stop` (or it fails)."""
        if not self._open:
            self.consumer, self._open, self._assigned, self._refresh_at = Consumer(self._config), True, set(), 0.0
        while not stop.is_set() and not self._assign_own():
            self._backoff(stop)
        if not stop.is_set():
            consume_loop(self.consumer, self, stop, backoff_s=self.idle_backoff_s)

    def _failed(self, exc: Exception, ran_s: float) -> None:
        if ran_s >= RETRY_S[1]:
            self._retry_s = RETRY_S[0]       # it had been running: a new failure, not the same one again
        log.error("the actuator's consume loop for %s failed after %.1f s (%s: %s); rebuilding the consumer in %g s",
                  self.node, ran_s, type(exc).__name__, exc, self._retry_s, exc_info=exc)
        with self._lock:
            self._restarts += 1
            self._last_error = bounded(f"{type(exc).__name__}: {exc}", 300)
        self._close_quietly()

    def _backoff(self, stop: threading.Event) -> None:
        stop.wait(self._retry_s)
        self._retry_s = min(2 * self._retry_s, RETRY_S[1])

    def _close_quietly(self) -> None:
        if self._open:
            try:
                self.close()
            except Exception as exc:  # noqa: BLE001 - closing a broken consumer: a new one is built anyway
                log.warning("closing the actuator's consumer failed: %s", exc)

    def stats(self) -> dict[str, object]:
        """Counts, plus liveness: `alive` (the run is going on), `loop_restarts` and `last_error` (see run)."""
        with self._lock:
            return {"partitions": list(self.partitions), "alive": self._alive, "loop_restarts": self._restarts,
                    "last_error": self._last_error, **dict(sorted(self.counts.items()))}

    def _assign_own(self) -> bool:
        """Add this node's partition for the topic's current partition count, and (after a rebuild) those assigned
        before; False when it cannot be done now."""
        self._refresh_at = time.monotonic() + self.metadata_refresh_s
        try:
            # all topics, not this one by name: a named request makes a broker with auto-create create it
            meta = self.consumer.list_topics(timeout=METADATA_TIMEOUT_S).topics.get(self.topic)
            if meta is None or meta.error is not None or not meta.partitions:
                log.warning("%s: no partitions yet (%s); retrying", self.topic, None if meta is None else meta.error)
                return False
            own = partition_of(self.node, len(meta.partitions))
            for partition in dict.fromkeys([*self.partitions, own]):
                if partition not in self._assigned:
                    self._assign(partition, len(meta.partitions))
        except Exception as exc:  # noqa: BLE001 - the broker is away or restarting: retried, never fatal
            log.warning("cannot assign %s for node %s yet: %s", self.topic, self.node, exc)
            return False
        return True

    def _assign(self, partition: int, count: int) -> None:
        tp = TopicPartition(self.topic, partition, self._start_offset(partition))
        self.consumer.incremental_assign([tp])
        self._assigned.add(partition)
        with self._lock:
            if partition not in self.partitions:
                self.partitions.append(partition)
        log.info("actuator %s reads %s[%d] from offset %d (of %d partitions)", self.node, self.topic, partition,
                 tp.offset, count)

    def _start_offset(self, partition: int) -> int:
        """After the last record this process handled when past the committed offset (a rebuilt consumer), else
        the committed offset, else the first record of the last command lifetime (older ones have expired)."""
        committed = self.consumer.committed([TopicPartition(self.topic, partition)], timeout=METADATA_TIMEOUT_S)[0]
        key = (self.topic, partition)
        with self._lock:
            handled = self._position.get(key, -1)
            if handled > max(committed.offset, -1):
                self._offsets.setdefault(key, handled)    # committed at the next store
                return handled
        if committed.offset >= 0:
            return committed.offset
        return self._lifetime_offset(partition)

    def _lifetime_offset(self, partition: int) -> int:
        """The first offset of the last command lifetime (older commands have expired)."""
        since_ms = (self.clock() - MAX_LIFETIME_NS) // 10**6
        # The end is read first: a command written between the two queries is either found by the time query or
        # at or past this end. (Read after it, the end could pass a command the time query had not seen yet, and
        # that command was skipped for good: seen once in the full suite.)
        _, high = self.consumer.get_watermark_offsets(TopicPartition(self.topic, partition),
                                                      timeout=METADATA_TIMEOUT_S, cached=False)
        found = self.consumer.offsets_for_times([TopicPartition(self.topic, partition, since_ms)],
                                                timeout=METADATA_TIMEOUT_S)[0]
        if found.error is not None:
            log.warning("%s[%d]: no offset for the time %d ms (%s); reading from the start", self.topic, partition,
                        since_ms, found.error)
            return OFFSET_BEGINNING
        if found.offset >= 0:
            return found.offset
        # no record since then: the end as it was, an absolute offset (OFFSET_END would be resolved at the first
        # fetch, and a command produced in between would be skipped for good)
        if high < 0:
            raise RuntimeError(f"{self.topic}[{partition}]: no high watermark ({high})")
        return high

    # -- the consume loop's handler (runtime/consume_loop.py) ------------------------------------------------

    def held(self) -> set[tuple[str, int]]:
        return set()

    def before_consume(self) -> None:
        if time.monotonic() >= self._refresh_at:
            self._assign_own()   # the topic grew: add the node's new partition
        self.actuator.expire_leases()   # QoS limits whose renewal never came (actuators/qos_leases.py)

    def handle(self, msg: Message) -> bool:
        err = msg.error()
        if err is not None:
            if err.code() == KafkaError._AUTO_OFFSET_RESET:
                return self._reset(msg)
            if err.code() != KafkaError._PARTITION_EOF:
                log.warning("consumer error: %s", err)
            return False
        acks: list[Event] = []
        try:
            acks = self._handle_record(msg)
        except Exception:  # noqa: BLE001 - a bug on one record: logged and counted, never stops the actuator
            log.exception("record %s[%d]@%d could not be handled", msg.topic(), msg.partition(), msg.offset())
            self._count("errors")
        with self._lock:
            self._acks += acks
            self._offsets[(msg.topic(), msg.partition())] = self._position[(msg.topic(), msg.partition())] = \
                msg.offset() + 1
        return False

    def _reset(self, msg: Message) -> bool:
        """The fetch position is out of range (the broker lost records): go on from the last command lifetime."""
        partition = msg.partition()
        self._count("offset_resets")
        try:
            offset = self._lifetime_offset(partition)
            with self._lock:
                self._position.pop((self.topic, partition), None)   # read again from there, even after a rebuild
            log.error("%s[%d]: fetch out of range (%s); reading again from offset %d (the last command lifetime)",
                      self.topic, partition, msg.error().str(), offset)
            self.consumer.incremental_unassign([TopicPartition(self.topic, partition)])
            self.consumer.incremental_assign([TopicPartition(self.topic, partition, offset)])
        except Exception:  # noqa: BLE001 - the broker is restarting: the next fetch fails again and retries
            log.exception("%s[%d]: cannot move past an out-of-range offset yet", self.topic, partition)
            time.sleep(RETRY_S[0])
        return True

    def store(self, due_only: bool, caught_up: bool = False) -> Offsets:
        """Hand the acks to `publish`, then return their records' offsets to commit (none if publish failed)."""
        with self._lock:
            acks, offsets = self._acks, self._offsets
        if acks:
            try:
                self.publish(list(acks))
            except Exception:  # noqa: BLE001 - kept, and handed over again at the next store; nothing committed
                log.exception("publishing %d acks failed; retried", len(acks))
                self._count("publish_errors")
                return {}
        with self._lock:
            self._acks, self._offsets = [], {}
        return offsets

    def close(self) -> None:
        self._open = False
        self.consumer.close()

    # -- one record ----------------------------------------------------------------------------------------------

    def _count(self, what: str, n: int = 1) -> None:
        with self._lock:
            self.counts[what] += n

    def _handle_record(self, msg: Message) -> list[Event]:
        key = msg.key()
        if key != self.node.encode():       # another node sharing the partition: not ours to read
            self._count("foreign")
            return []
        try:
            batch = decode_batch(msg.topic(), key, msg.value(), msg.headers())
        except DecodeError as exc:
            return self._malformed(msg, str(exc))
        acks: list[Event] = []
        for cmd in batch.events:
            if not isinstance(cmd, ControlCommand):   # decode_batch checked the schema: never happens
                continue
            ack = self.actuator.handle(cmd)
            self._count("handled")
            self._count(f"acks_{ack.status}")
            if ack.status != "refused" or self._may_refuse():
                acks.append(ack)
        return acks

    def _may_refuse(self) -> bool:
        """Whether a refused ack may be published now (the rate limit); counts and logs the ones that may not."""
        if self._refused_acks.take(self.clock()):
            return True
        self._count("refused_acks_dropped")
        dropped = self.counts["refused_acks_dropped"]
        if dropped & (dropped - 1) == 0:   # 1, 2, 4, 8, ...: a flood is logged, not one line per command
            log.warning("%d refused acks not published: more than %g a second (a flood of bad commands?)",
                        dropped, REFUSED_ACKS_PER_S)
        return False

    def _malformed(self, msg: Message, reason: str) -> list[Event]:
        self._count("malformed")
        named = named_commands(msg.value(), self.node)
        log.warning("malformed command record %s[%d]@%d (%d ids named): %s", msg.topic(), msg.partition(),
                    msg.offset(), len(named), bounded(reason, 300))
        if named:
            self._count("acks_refused", len(named))
            return [self.actuator.refuse(n.command_id, f"malformed command: {reason}", n.action, n.target)
                    for n in named if self._may_refuse()]
        self._count("deadlettered")
        return [dead_letter(msg.topic(), msg.partition(), msg.offset(), msg.key(), msg.value(), reason,
                            f"actuator-{self.node}")]
