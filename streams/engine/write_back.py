"""Pending state written, and waiting regrouped records sent, before every offset commit.

A Faust sensor's `on_commit_initiated` runs at the start of every commit, before the consumer picks the offsets
it commits (only records whose handling has ended, their state in the write-back) and before the producer flush
that precedes the commit, which waits for the sends started here (streams/engine/commit_barrier.py): so no offset
is committed before the state its records made is in the changelog, and a worker killed at any point restarts
from state at least as new as its offsets (tests/test_scale_out.py). The worker's `write` ends the worker on any
failure (streams/engine/faust_worker.py), so no later commit passes it.

On a revoke, Faust's commit before it (streams/engine/faust_fixes.py) writes what is pending; what records handled
after that commit made is dropped when the revoke's signal comes (streams/engine/faust_worker.py `_revoked`): those
records were not committed, and their partitions' next owner reads them again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from faust.sensors import Sensor


class WriteBackOnCommit(Sensor):
    def __init__(self, write: Callable[[], int]) -> None:
        super().__init__()
        self.write = write

    def on_commit_initiated(self, consumer: Any) -> Any:
        self.write()
        return None
