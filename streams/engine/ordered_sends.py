"""Records sent one after another, in the order they were handed over, behind the commit barrier.

Regrouped records leave the regroup buffer (streams/regroup_buffer.py) when a part is full, when its linger has
passed, or when a commit drains it; each take hands them here at once, without an await between the take and the
hand-over. So a commit that starts after a take finds them queued, and its flush waits for them (through the
barrier), and the records of one repartition partition go out in the order their events were taken.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from clocktower.streams.engine.commit_barrier import CommitBarrier


class OrderedSends:
    def __init__(self, barrier: CommitBarrier, send: Callable[[Any], Awaitable[None]]) -> None:
        self.barrier = barrier
        self.send = send
        self._queue: deque[Any] = deque()
        self._running = False

    def put(self, records: Iterable[Any]) -> None:
        """Queue `records`; a sender task (one at a time) sends them in order."""
        self._queue.extend(records)
        if self._queue and not self._running:
            self._running = True
            self.barrier.spawn(self._drain())

    def __len__(self) -> int:
        return len(self._queue)

    async def _drain(self) -> None:
        try:
            while self._queue:
                await self.send(self._queue[0])
                self._queue.popleft()
        finally:
            self._running = False
