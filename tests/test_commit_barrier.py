"""The commit barrier and the ordered sends (streams/engine/): what a commit's producer flush waits for.

Faust awaits `app.producer.flush()` before every offset commit; these tests stand in for Faust's producer with one
whose sends pause, to show the races the barrier closes: records taken for sending while an earlier send waits,
and a send that failed while no flush was waiting."""

from __future__ import annotations

import asyncio

import pytest

from clocktower.streams.engine.commit_barrier import CommitBarrier
from clocktower.streams.engine.ordered_sends import OrderedSends


class _Producer:
    """A producer whose sends pause until `release` is set; `sent` in the order they completed."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.sent: list[str] = []
        self.flushed = 0

    async def send(self, record: str) -> None:
        await self.release.wait()
        if record == "bad":
            raise RuntimeError("broker refused it")
        self.sent.append(record)

    async def flush(self) -> None:
        self.flushed += 1


class _App:
    def __init__(self) -> None:
        self.producer = _Producer()


def test_a_flush_waits_for_every_record_handed_over_even_while_a_send_waits() -> None:
    async def scenario() -> tuple[list[str], list[str], int]:
        app = _App()
        sends = OrderedSends(CommitBarrier(app), app.producer.send)
        sends.put(["a", "b"])
        flush = asyncio.ensure_future(app.producer.flush())   # a commit starts while "a" waits in send
        await asyncio.sleep(0.01)
        sends.put(["c"])                                       # taken after the commit started: still waited for
        assert not flush.done(), "the flush returned before the records handed over were sent"
        before = list(app.producer.sent)
        app.producer.release.set()
        await flush
        return before, app.producer.sent, app.producer.flushed

    before, sent, flushed = asyncio.run(scenario())
    assert before == [] and sent == ["a", "b", "c"] and flushed == 1   # in order, all before the real flush


def test_a_send_that_failed_before_any_flush_fails_every_later_flush() -> None:
    failures: list[BaseException] = []

    async def scenario() -> list[str]:
        app = _App()
        app.producer.release.set()
        barrier = CommitBarrier(app, on_failure=failures.append)
        sends = OrderedSends(barrier, app.producer.send)
        sends.put(["a", "bad", "c"])
        await asyncio.sleep(0.01)                  # the send fails while no flush waits
        outcomes = []
        for _ in range(2):
            try:
                await app.producer.flush()
                outcomes.append("flushed")
            except RuntimeError as exc:
                outcomes.append(str(exc))
        return outcomes + [str(app.producer.flushed)]

    assert asyncio.run(scenario()) == ["broker refused it", "broker refused it", "0"]
    assert len(failures) == 1 and str(failures[0]) == "broker refused it"


def test_a_cancelled_send_counts_as_a_failure() -> None:
    async def scenario() -> None:
        app = _App()
        barrier = CommitBarrier(app)
        barrier.spawn(app.producer.send("never"))
        await asyncio.sleep(0.01)
        for task in list(barrier._inflight):
            task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await app.producer.flush()

    asyncio.run(scenario())
