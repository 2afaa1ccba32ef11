"""Inserts on one background thread, in order, so that the sink decodes the next records while ClickHouse works.

The sink hands over a job (the batches taken together, and the offsets to commit once they are stored) and
gets back the offsets of the jobs finished since, oldest first. One thread runs the jobs first in, first out,
so rows of a partition are stored in offset order, and a job's offsets are released only after every earlier
job's: no offset is committed before its rows, and the sink's resume point (the highest offset stored) never
skips a record whose rows are missing.

An insert that fails (after the writer's own retries) fails that job, and every later job is skipped
rather than inserted: rows of later offsets would hide the failed ones from the resume point. The failure is
raised to the sink at its next call and stays until `reset` (the sink's loss check retries from the committed and
stored offsets, which reads the skipped records again). At most `depth` jobs are not done; a further one blocks
the sink until the oldest is, which bounds the rows held in memory (done jobs hold their offsets only).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from clocktower.sinks.clickhouse.partition_batch import PartitionBatch

Offsets = Mapping[tuple[str, int], int]


class SkippedAfterFailure(RuntimeError):
    """A job not run because an earlier one failed."""


class InsertQueue:
    def __init__(self, insert: Callable[[PartitionBatch], None], depth: int = 2) -> None:
        if depth < 1:
            raise ValueError("depth must be at least 1")
        self._insert = insert
        self.depth = depth
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="clickhouse-insert")
        self._jobs: deque[tuple[Future[None], Offsets]] = deque()
        self._failed = threading.Event()   # set by the insert thread; later jobs see it before they insert
        self.rows = 0                      # rows inserted (written by the insert thread only)

    def submit(self, batches: Sequence[PartitionBatch], offsets: Offsets) -> None:
        """Queue one job (blocks while `depth` jobs wait). Offsets alone (no rows) pass through in order too."""
        while not self._failed.is_set():   # after a failure nothing runs: no need to wait for room
            running = [job for job, _ in self._jobs if not job.done()]
            if len(running) < self.depth:
                break
            running[0].exception()   # wait for the oldest; its outcome is read by `finished`
        self._jobs.append((self._pool.submit(self._run, list(batches)), dict(offsets)))

    def finished(self, wait: bool = False) -> dict[tuple[str, int], int]:
        """Offsets of the jobs done since the last call (all of them with `wait`), later ones winning; raises
        the first failure, releasing nothing from the failed job on."""
        out: dict[tuple[str, int], int] = {}
        while self._jobs and (wait or self._jobs[0][0].done()):
            job, offsets = self._jobs[0]
            job.result()   # raises: the failed job and all after it stay queued until reset()
            self._jobs.popleft()
            out.update(offsets)
        return out

    @property
    def pending(self) -> int:
        """Jobs not yet released (running, waiting, or failed)."""
        return len(self._jobs)

    def reset(self) -> None:
        """Forget every job not released (after a failure: their records are read again) and the failure."""
        for job, _ in self._jobs:
            job.exception()   # let the thread finish or skip each before the failure is cleared
        self._jobs.clear()
        self._failed.clear()

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def _run(self, batches: list[PartitionBatch]) -> None:
        if self._failed.is_set():
            raise SkippedAfterFailure("an earlier insert failed; this job was not inserted")
        try:
            for batch in batches:
                self._insert(batch)
                self.rows += batch.rows
        except BaseException:
            self._failed.set()
            raise
