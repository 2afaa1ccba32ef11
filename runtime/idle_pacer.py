"""Pause an idle consumer's partitions between fetches, since the embedded broker answers every fetch at once.

Used by every consume loop (runtime/consume_loop.py: the ClickHouse sink, the node actuators).

noida-db ignores `fetch.wait.max.ms`, and librdkafka backs off only after fetch errors, never after an
empty fetch: an idle consumer's fetcher thread spins (thousands of fetches a second, tens of percent of a
core in the sink and as much in the broker). So once a consume brings no record, the pacer pauses the
fetchable partitions for `backoff_s`, then resumes them and asks for metadata, which wakes librdkafka's
broker thread at once (otherwise a resumed partition may wait up to a second for its next fetch). With
`enable.partition.eof` each resumed partition answers with its end-of-partition event, so the probe
consume returns after one fetch round instead of spinning for its whole timeout. A record that arrives
while idle waits at most `backoff_s` plus one fetch; while records flow, nothing is paused.

The same embedded broker makes a consumer that has caught up with a live stream spin as well: each fetch brings
the few records that came since the last, at once (measured: the sink's librdkafka thread at 24-28 % of a core
for a stream of 9.4k events/s, about 630 records/s, and the broker serving it). With `trickle_s` > 0 (the sink,
which batches a second anyway), once every fetchable partition has reported its end since its last record, the
pacer pauses them all for `trickle_s` and then reads what gathered meanwhile in a few short consumes (an empty
one among them does not count as idle: its fetch may not have come back yet, and a pause would drop it): a record
waits about `trickle_s` more. A partition that has not reported its end (a backlog) is never paused this way.

Pausing keeps the consumed position (librdkafka resumes from the last record handed over), so nothing
is skipped or read twice. Partitions held paused by the sink itself (`held`) are never resumed here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

log = logging.getLogger(__name__)
# What an idle sink adds to a record's latency, at most (plus one fetch round). 0.25 s: the idle stack then stays
# under 5 % of a core (benchmarks/idle_cpu.py; 0.1 s: about 6 %), small beside the sink's own batching (1 s).
IDLE_FETCH_BACKOFF_S = 0.25
ACTIVE_TIMEOUT_S = 0.1        # consume timeout while records flow
# Consume timeout after a trickle pause, until every partition reports its end again: the round that fetches
# what gathered returns within a few ms, and a longer timeout would spin the fetcher for all of it.
TRICKLE_ROUND_TIMEOUT_S = 0.01
TRICKLE_ROUNDS = 5            # then the usual timeout: a burst that outlasts them is read as a backlog
BATCH = 2000                  # records per consume while records flow
WAKE_TIMEOUT_S = 1.0
# Added to the consumer's configuration: every resumed partition reports its end at once.
CONSUMER_SETTINGS = {"enable.partition.eof": True}


class IdlePacer:
    """Decides each consume's size and timeout, and pauses/resumes the partitions while idle."""

    def __init__(self, consumer: Consumer, held: Callable[[], set[tuple[str, int]]],
                 backoff_s: float = IDLE_FETCH_BACKOFF_S, trickle_s: float = 0.0) -> None:
        self.consumer = consumer
        self.held = held
        self.backoff_s = backoff_s
        self.trickle_s = trickle_s
        self._paused: list[TopicPartition] = []
        self._resume_at: float | None = None
        self._probing = 0             # partitions just resumed: their end events end the next consume early
        self._at_end: set[tuple[str, int]] = set()   # partitions whose last message was their end event
        self._trickle_rounds = 0      # after a trickle pause: short consumes left until all are at their end
        self.trickle_pauses = 0

    def next_consume(self) -> tuple[int, float]:
        """(num_messages, timeout) for the next consume."""
        if self._resume_at is not None:
            return BATCH, max(0.0, min(ACTIVE_TIMEOUT_S, self._resume_at - time.monotonic()))
        if self._trickle_rounds:
            return BATCH, TRICKLE_ROUND_TIMEOUT_S
        return (self._probing or BATCH), ACTIVE_TIMEOUT_S

    def after(self, msgs: list[Message]) -> None:
        """Account for what the last consume returned: pause when idle, resume when the backoff is over."""
        now = time.monotonic()
        if self.trickle_s > 0:
            self._track_ends(msgs)
        if self._resume_at is not None:
            if now >= self._resume_at:
                self._resume()
            return
        self._probing = 0
        trickling, self._trickle_rounds = self._trickle_rounds > 0, max(0, self._trickle_rounds - 1)
        got_records = any(m.error() is None for m in msgs)
        if self.backoff_s > 0 and not got_records and not trickling:   # a short round may end before its fetch
            self._pause(now, self.backoff_s)
        elif (got_records or trickling) and self.trickle_s > 0 and self._all_at_end():
            self.trickle_pauses += 1
            self._pause(now, self.trickle_s)

    def _track_ends(self, msgs: list[Message]) -> None:
        for m in msgs:
            err = m.error()
            if err is None:
                self._at_end.discard((m.topic(), m.partition()))
            elif err.code() == KafkaError._PARTITION_EOF:
                self._at_end.add((m.topic(), m.partition()))

    def _all_at_end(self) -> bool:
        """Every fetchable partition has reported its end since its last record (none fetchable: False)."""
        parts = self._fetchable(self.consumer.assignment())
        return bool(parts) and all((tp.topic, tp.partition) in self._at_end for tp in parts)

    def _fetchable(self, parts: list[TopicPartition]) -> list[TopicPartition]:
        held = self.held()
        return [tp for tp in parts if (tp.topic, tp.partition) not in held]

    def _pause(self, now: float, for_s: float) -> None:
        parts = self._fetchable(self.consumer.assignment())
        self._trickle_rounds = 0
        if not parts:
            return
        self.consumer.pause(parts)
        self._paused, self._resume_at = parts, now + for_s

    def _resume(self, wake: bool = True) -> None:
        assigned = {(tp.topic, tp.partition) for tp in self.consumer.assignment()}
        parts = [tp for tp in self._fetchable(self._paused) if (tp.topic, tp.partition) in assigned]
        self._paused, self._resume_at = [], None
        if not parts:
            return
        self.consumer.resume(parts)
        self._probing = len(parts)
        self._at_end -= {(tp.topic, tp.partition) for tp in parts}   # each reports its end again once fetched
        self._trickle_rounds = TRICKLE_ROUNDS if self.trickle_s > 0 else 0
        if not wake:
            return
        try:
            self.consumer.list_topics(parts[0].topic, timeout=WAKE_TIMEOUT_S)   # wakes the broker thread
        except Exception as exc:  # noqa: BLE001 - only a wake-up: the fetch still starts, within a second
            log.debug("metadata request after resume failed: %s", exc)

    def release(self) -> None:
        """Resume what the pacer paused (the sink is stopping): the consumer is left as the sink set it."""
        if self._resume_at is not None:
            self._resume_at = time.monotonic()
            self._resume(wake=False)
