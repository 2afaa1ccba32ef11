"""Sends started where no await is possible, which every offset commit waits for.

The write-back (a commit sensor, or the end of a batch) runs synchronously, but sending is asynchronous: its sends
run as tasks, and the producer's `flush` waits for them first. Faust flushes the producer before every offset
commit and before giving partitions up, so no offset is committed, and no partition handed over, before what its
records made (changelog batches, regrouped records) has been taken by the broker. A send that fails raises in that
flush: the commit fails, and the worker stops (its restart reads those records again).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any


class CommitBarrier:
    def __init__(self, app: Any) -> None:
        self.app = app
        self._inflight: set[asyncio.Task] = set()
        self._flush: Callable[[], Awaitable[None]] | None = None

    def spawn(self, send: Coroutine[Any, Any, None]) -> None:
        """Run `send` now, in a task the next producer flush waits for."""
        self._wrap_flush()
        task = asyncio.ensure_future(send)
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)

    async def wait(self) -> None:
        """Until every spawned send has ended; raises what a failed one raised."""
        while self._inflight:
            await asyncio.gather(*list(self._inflight))

    def _wrap_flush(self) -> None:
        if self._flush is not None:
            return
        producer = self.app.producer
        self._flush = flush = producer.flush

        async def flush_after_barrier() -> None:
            await self.wait()
            await flush()

        producer.flush = flush_after_barrier
