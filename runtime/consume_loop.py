"""The consume-and-commit loop every Kafka consumer of ours runs: the ClickHouse sink and the node actuators.

One loop, so the rules that make a consumer lose nothing are written once:
consume (paced by the idle pacer: the embedded broker answers fetches at once) -> hand each record to the
handler -> store what is due (`store`: rows inserted, acks handed to the publisher; `caught_up` once a
consume brings no record) -> commit the offsets `store` returns, only then -> at the end, store and commit
everything, and close.
An offset is therefore never committed before what its record produced is durable, and a crash re-reads
from the last commit (the handler makes that idempotent). What differs stays in the handler: decoding,
batching, the sink's loss checks (`held` partitions are neither handled nor resumed by the pacer), the
actuator's verification.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Protocol

from confluent_kafka import Consumer, Message, TopicPartition

from clocktower.runtime.idle_pacer import IDLE_FETCH_BACKOFF_S, IdlePacer

Offsets = Mapping[tuple[str, int], int]    # (topic, partition) -> the next offset to read


class RecordHandler(Protocol):
    def held(self) -> set[tuple[str, int]]:
        """Partitions the handler holds paused: their records are skipped, and the pacer never resumes them."""
        ...

    def before_consume(self) -> None:
        """Periodic work between consumes (a due re-check); may change the assignment."""
        ...

    def handle(self, msg: Message) -> bool:
        """Take one record (or a consumer error). True when the fetch positions were reset: the rest of the
        consumed list is dropped (it is fetched again)."""
        ...

    def store(self, due_only: bool, caught_up: bool = False) -> Offsets:
        """Make the handled records' results durable (all, or only what is due); returns the offsets to commit.
        `caught_up`: the last consume brought no record, so what waits for more to batch with may go now."""
        ...

    def close(self) -> None:
        """After the final store and commit: release what the handler holds (the consumer, producers)."""
        ...


def commit(consumer: Consumer, offsets: Offsets) -> None:
    """Commit `offsets` synchronously (nothing when empty)."""
    if offsets:
        consumer.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()], asynchronous=False)


def consume_loop(consumer: Consumer, handler: RecordHandler, stop: threading.Event,
                 backoff_s: float = IDLE_FETCH_BACKOFF_S, trickle_s: float = 0.0) -> None:
    """Run until `stop` is set; see the module doc. The consumer is subscribed or assigned by the caller;
    `backoff_s` and `trickle_s` pace its fetches (runtime/idle_pacer.py)."""
    pacer = IdlePacer(consumer, held=handler.held, backoff_s=backoff_s, trickle_s=trickle_s)
    try:
        while not stop.is_set():
            handler.before_consume()
            num_messages, timeout = pacer.next_consume()
            msgs = consumer.consume(num_messages=num_messages, timeout=timeout)
            for msg in msgs:
                if (msg.topic(), msg.partition()) in handler.held():
                    continue               # paused, unchecked: read from its checked offset once released
                if handler.handle(msg):
                    break                  # positions were reset: the rest of this list is fetched again
                commit(consumer, handler.store(due_only=True))   # per record: nothing grows past its bound
            # Caught up (no record came): the handler may store what it would keep batching (the sink: every batch,
            # once a full batch's rows wait in all), so the tail of a burst does not wait out its 1 s.
            caught_up = not any(m.error() is None for m in msgs)
            commit(consumer, handler.store(due_only=True, caught_up=caught_up))
            pacer.after(msgs)
        pacer.release()
        commit(consumer, handler.store(due_only=False))
    finally:
        handler.close()
