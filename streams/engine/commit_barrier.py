"""Sends started where no await is possible, which every offset commit waits for.

The write-back (a commit sensor, or the end of a batch) and the regrouped records (streams/regroup_buffer.py) are
handed over synchronously, but sending is asynchronous: the sends run as tasks, and the producer's `flush` waits
for them first. Faust flushes the producer before every offset commit and before giving partitions up, so no
offset is committed before what its records made (changelog batches, regrouped records) has been handed to the
producer, whose own flush then waits for the broker's acknowledgement.

A send that fails is kept: every later flush raises it, so no later commit goes through, and `on_failure` (the
worker's: end it at once for a restart, streams/engine/faust_worker.py) is told. A failed task is not simply
forgotten: a failure while no flush was waiting would otherwise let the next commit pass over records whose output
never left.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any


class CommitBarrier:
    def __init__(self, app: Any, on_failure: Callable[[BaseException], None] | None = None) -> None:
        self.app = app
        self.on_failure = on_failure
        self.failure: BaseException | None = None
        self._inflight: set[asyncio.Task] = set()
        self._flush: Callable[[], Awaitable[None]] | None = None

    def spawn(self, send: Coroutine[Any, Any, None]) -> None:
        """Run `send` now, in a task the next producer flush waits for."""
        self._wrap_flush()
        task = asyncio.ensure_future(send)
        self._inflight.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task) -> None:
        self._inflight.discard(task)
        exc = asyncio.CancelledError("a send was cancelled") if task.cancelled() else task.exception()
        if exc is None:
            return
        first = self.failure is None
        if first:
            self.failure = exc
        if first and self.on_failure is not None:
            self.on_failure(exc)

    async def wait(self) -> None:
        """Until every spawned send has ended; raises the first that failed (now or before)."""
        while self._inflight:
            await asyncio.wait(list(self._inflight))
        if self.failure is not None:
            raise self.failure

    def _wrap_flush(self) -> None:
        if self._flush is not None:
            return
        producer = self.app.producer
        self._flush = flush = producer.flush

        async def flush_after_barrier() -> None:
            await self.wait()
            await flush()

        producer.flush = flush_after_barrier
