"""The shared consume-and-commit loop (the sink's and the actuators'), against a fake consumer: offsets are committed
only as `store` returns them, after it; held partitions are skipped; a reset drops the rest of a consumed list; the
end stores and commits everything, and the handler is closed even when the loop fails."""

from __future__ import annotations

import threading

import pytest
from confluent_kafka import Message, TopicPartition

from clocktower.runtime.consume_loop import Offsets, consume_loop

T = "control.commands"


def _msg(partition: int, offset: int) -> Message:
    return Message(topic=T, partition=partition, offset=offset, key=b"k", value=b"v")


class FakeConsumer:
    def __init__(self, polls: list[list[Message]], stop: threading.Event, log: list[tuple]) -> None:
        self.polls, self.stop, self.log = polls, stop, log

    def consume(self, num_messages: int, timeout: float) -> list[Message]:
        if not self.polls:
            self.stop.set()
            return []
        return self.polls.pop(0)

    def commit(self, offsets: list[TopicPartition], asynchronous: bool) -> None:
        assert asynchronous is False
        self.log.append(("commit", sorted((tp.partition, tp.offset) for tp in offsets)))

    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition(T, 0), TopicPartition(T, 1)]

    def pause(self, parts: list[TopicPartition]) -> None: ...

    def resume(self, parts: list[TopicPartition]) -> None: ...

    def list_topics(self, topic: str, timeout: float) -> None: ...


class Handler:
    """Stores (and so releases for commit) only every `every`-th record unless asked for all."""

    def __init__(self, log: list[tuple], held: set[tuple[str, int]] | None = None, reset_at: int | None = None,
                 every: int = 2) -> None:
        self.log, self._held, self.reset_at, self.every = log, held or set(), reset_at, every
        self.pending: dict[tuple[str, int], int] = {}
        self.closed = False

    def held(self) -> set[tuple[str, int]]:
        return self._held

    def before_consume(self) -> None:
        self.log.append(("tick",))

    def handle(self, msg: Message) -> bool:
        self.log.append(("handle", msg.partition(), msg.offset()))
        if msg.offset() == self.reset_at:
            return True
        self.pending[(msg.topic(), msg.partition())] = msg.offset() + 1
        return False

    def store(self, due_only: bool, caught_up: bool = False) -> Offsets:
        """Like the sink: once caught up, what waits for more to batch with goes too."""
        if not self.pending or (due_only and not caught_up and sum(self.pending.values()) % self.every):
            return {}
        self.log.append(("store", "caught up" if caught_up else due_only))
        out, self.pending = self.pending, {}
        return out

    def close(self) -> None:
        self.closed = True


def _run(polls: list[list[Message]], handler_kw: dict | None = None) -> tuple[list[tuple], Handler]:
    log: list[tuple] = []
    stop = threading.Event()
    handler = Handler(log, **(handler_kw or {}))
    consume_loop(FakeConsumer(polls, stop, log), handler, stop, backoff_s=0)  # type: ignore[arg-type]
    return log, handler


def test_offsets_are_committed_only_after_store_returns_them() -> None:
    log, handler = _run([[_msg(0, 0), _msg(0, 1)], [_msg(1, 0)]])
    events = [e for e in log if e[0] != "tick"]
    assert events == [("handle", 0, 0),                          # pending sum 1: not due
                      ("handle", 0, 1), ("store", True), ("commit", [(0, 2)]),
                      ("handle", 1, 0),                          # 1: not due
                      ("store", "caught up"), ("commit", [(1, 1)])]   # the last consume brought nothing
    assert handler.closed


def test_held_partitions_are_skipped_and_a_reset_drops_the_rest_of_the_list() -> None:
    log, _ = _run([[_msg(1, 0), _msg(0, 0), _msg(0, 1), _msg(0, 2)], [_msg(0, 1)]],
                  {"held": {(T, 1)}, "reset_at": 1, "every": 100})
    handled = [e[1:] for e in log if e[0] == "handle"]
    assert handled == [(0, 0), (0, 1), (0, 1)], "partition 1 held; after the reset at 1, offset 2 is fetched again"


def test_the_handler_is_closed_when_the_loop_fails() -> None:
    class Failing(Handler):
        def store(self, due_only: bool, caught_up: bool = False) -> Offsets:
            raise RuntimeError("insert failed")

    stop = threading.Event()
    handler = Failing([])
    with pytest.raises(RuntimeError):
        consume_loop(FakeConsumer([[_msg(0, 0)]], stop, []), handler, stop, backoff_s=0)  # type: ignore[arg-type]
    assert handler.closed


def test_a_consume_that_brings_no_record_says_the_handler_caught_up() -> None:
    """Caught up: the handler may store what it keeps batching, so the tail of a burst does not wait out its age."""
    log, _ = _run([[_msg(0, 0)], [], [_msg(1, 0)]], {"every": 100})
    events = [e for e in log if e[0] != "tick"]
    assert events == [("handle", 0, 0),                               # not due
                      ("store", "caught up"), ("commit", [(0, 1)]),   # the next consume brought nothing
                      ("handle", 1, 0),
                      ("store", "caught up"), ("commit", [(1, 1)])]   # the fake's polls ran out: nothing again


def test_a_consume_of_only_end_of_partition_events_counts_as_caught_up() -> None:
    class Eof:
        def error(self) -> object:
            return object()   # any error: the pacer's and the loop's test is "no record"

        def topic(self) -> str:
            return T

        def partition(self) -> int:
            return 0

    stored: list[tuple[bool, bool]] = []

    class Recording(Handler):
        def handle(self, msg: Message) -> bool:
            return False if isinstance(msg, Eof) else super().handle(msg)

        def store(self, due_only: bool, caught_up: bool = False) -> Offsets:
            stored.append((due_only, caught_up))
            return super().store(due_only, caught_up)

    stop = threading.Event()
    consume_loop(FakeConsumer([[_msg(0, 0)], [Eof()]], stop, []), Recording([], every=100), stop,  # type: ignore[arg-type,list-item]
                 backoff_s=0)
    # the record: due only, per record and after its consume; the end event: per record, then caught up
    assert stored[:4] == [(True, False), (True, False), (True, False), (True, True)]


def test_the_end_stores_and_commits_everything() -> None:
    class KeepsBatching(Handler):
        def store(self, due_only: bool, caught_up: bool = False) -> Offsets:
            return super().store(due_only)   # a handler that never stores early

    log: list[tuple] = []
    stop = threading.Event()
    consume_loop(FakeConsumer([[_msg(0, 0)]], stop, log), KeepsBatching(log, every=100), stop,  # type: ignore[arg-type]
                 backoff_s=0)
    assert [e for e in log if e[0] in ("store", "commit")] == [("store", False), ("commit", [(0, 1)])]
