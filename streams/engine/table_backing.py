"""A Faust table as a StateStore's backing: reads from the partition being processed, and writes a partition's
changes to its RocksDB and changelog in one go (the write-back of streams/state_store.py).

Faust writes a table key by key, each write a RocksDB put and a changelog record sent on its own, and picks the
partition from the event being processed. The write-back runs at commit, outside any event, so it names the
partition itself: a WriteBatch into that partition's RocksDB, then the records to that partition of the changelog
in batches (streams/engine/changelog_batches.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import faust
from faust.streams import current_event
from rocksdict import WriteBatch

from clocktower.streams.engine.changelog_batches import ChangelogBatches


class TableBacking:
    def __init__(self, table: faust.Table, changelog: ChangelogBatches,
                 on_failure: Callable[[BaseException], None] | None = None) -> None:
        """`on_failure`: told when a write raises (the worker's ends it: a write that fails inside a batch would
        otherwise dead-letter that record, and a later commit pass over it)."""
        self.table = table
        self.changelog = changelog
        self.on_failure = on_failure

    def get(self, key: bytes, default: bytes | None = None) -> bytes | None:
        event = current_event()
        if event is None:                       # outside an event Faust looks the key up in every partition
            return self.table.get(key, default)
        value = self.table.data._db_for_partition(event.message.partition).get(key)
        return default if value is None else value

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        """The entries of the partitions this worker owns (Faust's own iteration)."""
        return iter(self.table.items())

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.table.keys())

    def __len__(self) -> int:
        return len(self.table)

    def write(self, partition: int, puts: list[tuple[bytes, bytes]], deletes: list[bytes]) -> None:
        try:
            self._write(partition, puts, deletes)
        except Exception as exc:
            if self.on_failure is not None:
                self.on_failure(exc)
            raise

    def _write(self, partition: int, puts: list[tuple[bytes, bytes]], deletes: list[bytes]) -> None:
        batch = WriteBatch(raw_mode=True)
        for key, value in puts:
            batch.put(key, value)
        for key in deletes:
            batch.delete(key)
        self.table.data._db_for_partition(partition).write(batch)
        self.changelog.send(self.table, partition, [*puts, *((key, None) for key in deletes)])
