"""The sink's idle pacer against a fake consumer: it pauses only while idle, never resumes a partition the loss
check holds or one a rebalance took away, and release() gives back exactly what it paused."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, Message, TopicPartition

from clocktower.runtime import idle_pacer
from clocktower.runtime.idle_pacer import IdlePacer

T = "telemetry.links"


class FakeConsumer:
    """assignment/pause/resume/list_topics, tracking which partitions are paused."""

    def __init__(self, parts: list[int]) -> None:
        self.assigned = [TopicPartition(T, p) for p in parts]
        self.paused: set[int] = set()
        self.wakes = 0

    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition) for tp in self.assigned]

    def pause(self, parts: list[TopicPartition]) -> None:
        self.paused |= {tp.partition for tp in parts}

    def resume(self, parts: list[TopicPartition]) -> None:
        assert all(tp.partition in {a.partition for a in self.assigned} for tp in parts), "resumed an unassigned one"
        self.paused -= {tp.partition for tp in parts}

    def list_topics(self, topic: str, timeout: float) -> None:
        self.wakes += 1


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(idle_pacer.time, "monotonic", c)
    return c


def _record(p: int) -> Message:
    return Message(topic=T, partition=p, offset=5, key=b"n", value=b"[]")


def _eof(p: int) -> Message:
    return Message(topic=T, partition=p, offset=5, error=KafkaError(KafkaError._PARTITION_EOF, "eof"))


def test_an_idle_consume_pauses_and_the_backoff_end_resumes_with_a_wake_up(clock: Clock) -> None:
    consumer, held = FakeConsumer([0, 1, 2]), set()
    pacer = IdlePacer(consumer, held=lambda: held, backoff_s=0.25)  # type: ignore[arg-type]
    pacer.after([_record(0)])
    assert consumer.paused == set(), "records flow: nothing paused"
    pacer.after([_eof(1)])
    assert consumer.paused == {0, 1, 2}
    assert pacer.next_consume()[1] <= 0.25
    clock.now += 0.1
    pacer.after([])
    assert consumer.paused == {0, 1, 2}, "still backing off"
    clock.now += 0.2
    pacer.after([])
    assert consumer.paused == set() and consumer.wakes == 1
    assert pacer.next_consume() == (3, idle_pacer.ACTIVE_TIMEOUT_S), "the probe ends after the 3 end events"


def test_partitions_the_loss_check_holds_are_never_resumed(clock: Clock) -> None:
    consumer, held = FakeConsumer([0, 1, 2]), {(T, 1)}
    consumer.pause([TopicPartition(T, 1)])            # the sink paused it: its check has not answered
    pacer = IdlePacer(consumer, held=lambda: held, backoff_s=0.25)  # type: ignore[arg-type]
    pacer.after([])
    assert consumer.paused == {0, 1, 2}
    held.add((T, 2))                                  # a recheck during the back-off holds another one
    clock.now += 0.3
    pacer.after([])
    assert consumer.paused == {1, 2}, "only the unheld partition resumed"
    pacer.after([])                                   # idle again: the held ones are not the pacer's to touch
    clock.now += 0.3
    pacer.after([])
    pacer.release()
    assert consumer.paused == {1, 2}


def test_a_rebalance_during_the_back_off_resumes_only_what_is_still_assigned(clock: Clock) -> None:
    consumer = FakeConsumer([0, 1, 2])
    pacer = IdlePacer(consumer, held=set, backoff_s=0.25)  # type: ignore[arg-type]
    pacer.after([])
    consumer.assigned = [TopicPartition(T, 2), TopicPartition(T, 3)]   # 0 and 1 revoked, 3 newly assigned
    consumer.paused = {2}                             # librdkafka forgets the pause state of revoked partitions
    clock.now += 0.3
    pacer.after([])                                   # FakeConsumer.resume asserts nothing unassigned is resumed
    assert consumer.paused == set() and consumer.wakes == 1


def test_release_resumes_what_the_pacer_paused_and_nothing_else(clock: Clock) -> None:
    consumer, held = FakeConsumer([0, 1]), {(T, 0)}
    consumer.pause([TopicPartition(T, 0)])
    pacer = IdlePacer(consumer, held=lambda: held, backoff_s=0.25)  # type: ignore[arg-type]
    pacer.release()
    assert consumer.paused == {0}, "nothing paused by the pacer: nothing to release"
    pacer.after([])
    assert consumer.paused == {0, 1}
    pacer.release()                                   # the sink stops mid back-off
    assert consumer.paused == {0} and consumer.wakes == 0, "resumed without a wake-up; the held one stays paused"
    assert pacer.next_consume()[1] == idle_pacer.ACTIVE_TIMEOUT_S


def test_a_caught_up_consumer_pauses_for_the_trickle_then_reads_what_gathered_in_short_rounds(clock: Clock) -> None:
    """Records flow, but every partition has reported its end since its last record: pause for trickle_s (the
    embedded broker would answer each fetch at once with the few records since the last)."""
    consumer = FakeConsumer([0, 1])
    pacer = IdlePacer(consumer, held=set, backoff_s=0.25, trickle_s=0.1)  # type: ignore[arg-type]
    pacer.after([_record(0), _eof(0), _record(1)])
    assert consumer.paused == set(), "partition 1 has not reported its end: maybe a backlog, nothing paused"
    pacer.after([_record(0), _eof(1)])
    assert consumer.paused == set(), "partition 0 had a record after its end event"
    pacer.after([_eof(0), _record(1), _eof(1)])
    assert consumer.paused == {0, 1} and pacer.trickle_pauses == 1
    assert pacer.next_consume()[1] <= 0.1
    clock.now += 0.1
    pacer.after([])
    assert consumer.paused == set() and consumer.wakes == 1
    assert pacer.next_consume() == (idle_pacer.BATCH, idle_pacer.TRICKLE_ROUND_TIMEOUT_S), "short rounds"
    pacer.after([_record(0), _eof(0)])
    assert consumer.paused == set(), "the ends were forgotten on resume: each must report again"
    pacer.after([_record(0), _eof(0), _eof(1)])
    assert consumer.paused == {0, 1} and pacer.trickle_pauses == 2


def test_without_trickle_records_never_pause(clock: Clock) -> None:
    consumer = FakeConsumer([0])
    pacer = IdlePacer(consumer, held=set, backoff_s=0.25)  # type: ignore[arg-type]
    pacer.after([_record(0), _eof(0)])
    assert consumer.paused == set() and pacer.trickle_pauses == 0


def test_a_held_partition_does_not_keep_the_others_from_their_trickle_pause(clock: Clock) -> None:
    consumer, held = FakeConsumer([0, 1]), {(T, 1)}
    pacer = IdlePacer(consumer, held=lambda: held, backoff_s=0.25, trickle_s=0.1)  # type: ignore[arg-type]
    pacer.after([_record(0), _eof(0)])
    assert consumer.paused == {0}, "the held partition is neither waited for nor paused by the pacer"


def test_short_rounds_end_after_a_bound_when_a_burst_keeps_coming(clock: Clock) -> None:
    consumer = FakeConsumer([0])
    pacer = IdlePacer(consumer, held=set, backoff_s=0.25, trickle_s=0.1)  # type: ignore[arg-type]
    pacer.after([_record(0), _eof(0)])
    clock.now += 0.1
    pacer.after([])
    for _ in range(idle_pacer.TRICKLE_ROUNDS):
        assert pacer.next_consume()[1] == idle_pacer.TRICKLE_ROUND_TIMEOUT_S
        pacer.after([_record(0)])                     # a backlog: never at its end
    assert pacer.next_consume() == (idle_pacer.BATCH, idle_pacer.ACTIVE_TIMEOUT_S)


def test_an_empty_short_round_is_not_idle(clock: Clock) -> None:
    """After a trickle pause, the fetch of what gathered may take longer than a short round: an empty round must
    not pause the partitions for the idle backoff (librdkafka would drop the fetch in flight)."""
    consumer = FakeConsumer([0, 1])
    pacer = IdlePacer(consumer, held=set, backoff_s=0.25, trickle_s=0.1)  # type: ignore[arg-type]
    pacer.after([_record(0), _eof(0), _record(1), _eof(1)])
    clock.now += 0.1
    pacer.after([])                                   # resumed
    for _ in range(idle_pacer.TRICKLE_ROUNDS - 1):
        pacer.after([])
        assert consumer.paused == set(), "an empty short round paused the partitions"
    pacer.after([_record(0), _eof(0), _eof(1)])
    assert consumer.paused == {0, 1} and pacer.trickle_pauses == 2
    clock.now += 0.1
    pacer.after([])
    for _ in range(idle_pacer.TRICKLE_ROUNDS):
        pacer.after([])
    assert consumer.paused == set()
    pacer.after([])                                   # a full consume with nothing after the rounds: idle
    assert consumer.paused == {0, 1} and pacer.next_consume()[1] <= 0.25
