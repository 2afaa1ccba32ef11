"""Pending state written before every offset commit, and dropped when partitions are revoked.

A Faust sensor's `on_commit_initiated` runs at the start of every commit, before the consumer picks the offsets
it commits (only records whose handling has ended, their state in the write-back) and before the producer flush
that precedes the commit: so no offset is committed before the state its records made has been sent, and a
worker killed at any point restarts from state at least as new as its offsets (tests/test_scale_out.py). An
exception here stops the commit: the offsets stay where they were.

On a revoke the pending state is dropped, not written: by then the partitions may be another worker's, and the
records that made it were not committed, so their next owner reads them again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from faust.sensors import Sensor

log = logging.getLogger(__name__)


class WriteBackOnCommit(Sensor):
    def __init__(self, write: Callable[[], int]) -> None:
        super().__init__()
        self.write = write
        self.written = 0

    def on_commit_initiated(self, consumer: Any) -> Any:
        self.written += self.write()
        return None
