"""Iteration boundaries on one rank: a context manager per iteration, or `step()` marks."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

# record(iteration, start_ns, end_ns, collectives launched during it, or None when not counted)
Recorder = Callable[[int, int, int, "int | None"], None]


class IterationClock:
    """Numbers iterations from `start` and records each one's [start_ns, end_ns] on this rank.

    Either wrap each iteration in `with clock.iteration():`, or call `clock.step()` at the TOP of each
    iteration: a step ends the iteration in progress (if any) and starts the next; `finish()` (called by
    Telemetry.close) ends the last one. Do not mix the two styles in one loop.

    `launched` (the comm hook's count of collectives launched so far) makes each record carry how many were
    launched during the iteration, so the stream's breakdown knows when it has them all.
    """

    def __init__(self, record: Recorder, start: int = 0, before_end: Callable[[], None] | None = None,
                 launched: Callable[[], int] | None = None) -> None:
        self.record = record
        self.next_iteration = start
        self.before_end = before_end     # e.g. torch.cuda.synchronize, so end_ns covers queued GPU work
        self.launched = launched
        self._open: tuple[int, int, int] | None = None   # (iteration, start_ns, launched) begun by step()

    @contextmanager
    def iteration(self, number: int | None = None) -> Iterator[int]:
        """Time the body as one iteration (numbered `number`, else the next); yields the number.

        An iteration that raises is not recorded (it did not complete).
        """
        it = self._take(number)
        before = self._launched()
        start_ns = time.time_ns()
        yield it
        self._end(it, start_ns, before)

    def step(self, number: int | None = None) -> int:
        """End the iteration begun by the previous step (if any) and begin the next; returns its number."""
        self.finish()
        it = self._take(number)
        before = self._launched()
        self._open = (it, time.time_ns(), before)
        return it

    def finish(self) -> None:
        """End the iteration begun by step(), if one is open."""
        if self._open is not None:
            it, start_ns, before = self._open
            self._open = None
            self._end(it, start_ns, before)

    def _take(self, number: int | None) -> int:
        it = self.next_iteration if number is None else number
        self.next_iteration = it + 1
        return it

    def _launched(self) -> int:
        return self.launched() if self.launched is not None else 0

    def _end(self, it: int, start_ns: int, before: int) -> None:
        if self.before_end is not None:
            self.before_end()
        end_ns = time.time_ns()
        count = self._launched() - before if self.launched is not None else None
        self.record(it, start_ns, end_ns, count)
