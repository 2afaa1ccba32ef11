"""A processor's state: entries by key, each with an event-time expiry, over a mapping of bytes.

In the Faust app the mapping is a table on the rocksdict store with a changelog topic, so a worker that
restarts or takes over a partition gets the state back; in tests and the in-memory pipeline it is a dict.
Entries are decoded on first use in a batch and encoded once, at `flush`, at the end of the batch.

Write-back (the Faust app, issue 19), in the manner of Kafka Streams' record cache: a batch's encoded changes are
kept pending, not written, and `write_pending` writes them to the backing (RocksDB and the changelog, per partition
in one go) before the worker commits its offsets. A key written many times between two commits is written once; a
key made and deleted between them (a half-join that completes) is never written. Pending entries are encoded bytes,
so a processor sees exactly what it would have read back from the table. What is pending when the worker dies is
lost with the offsets it was not committed with: the records that made it are read again. On a revoke Faust
commits first (streams/engine/faust_fixes.py), which writes it; what the records handled after that commit made is
dropped (`drop_pending`, and `reload`), and they are read again too. Written state can be ahead of what was sent
downstream (RocksDB is written before the producer's flush): the processors re-emit what a redelivered record made
(streams/processor.py), as they did when every batch was written at once.

Every entry carries its expiry and its partition, so `expire` can drop the entries of the partition being
processed whose event time has passed (the table may be written only from its own partition's events), and
`reload` can rebuild the expiry index from the table alone after a rebalance.

A partition keeps at most `max_entries` (issue 18, finding 12: 600 invented node names each made entries that
lived for the detectors' 24 h). A new key past that is not kept, and counted in `refused`: the processor goes on
as if it had never seen the key (a detector treats its next event as its first). Keys already kept are always
updated, and a processor may write keys that belong to a kept one (a link's timers) with `capped=False`, or ask
`admits` first, so a fleet whose state was kept before a flood keeps being watched. An entry is a few hundred bytes
(measured after 100 readings: a GPU's 502, a link's 739, encoded), so the default of 100,000 per partition
bounds a partition's entries to about 50-75 MB (and the expiry index in memory to about as much).
"""

from __future__ import annotations

import heapq
import logging
import struct
from collections.abc import MutableMapping
from typing import Any, Protocol

from clocktower.streams.delivery import Delivery
from clocktower.streams.processor import Processor

_HEADER = struct.Struct(">qH")   # expires_ns, partition
log = logging.getLogger(__name__)
DEFAULT_MAX_ENTRIES = 100_000     # per partition: CLOCKTOWER_STREAMS_MAX_ENTRIES
MAX_PENDING = 50_000              # write-back: pending entries written early past this (ahead of offsets: as above)


class PartitionedBacking(Protocol):
    """A backing that writes a partition's changes in one go (streams/engine/table_backing.py)."""

    def get(self, key: bytes) -> bytes | None: ...
    def items(self) -> Any: ...
    def write(self, partition: int, puts: list[tuple[bytes, bytes]], deletes: list[bytes]) -> None: ...


class StateCodec(Protocol):
    def encode_state(self, value: Any) -> bytes: ...
    def decode_state(self, data: bytes) -> Any: ...


class StateStore:
    def __init__(self, codec: StateCodec, backing: MutableMapping[bytes, bytes] | PartitionedBacking | None = None,
                 max_entries: int = DEFAULT_MAX_ENTRIES, write_back: bool = False,
                 max_pending: int = MAX_PENDING) -> None:
        """`write_back`: keep each batch's changes pending until `write_pending` (the module's docstring)."""
        self.codec = codec
        self.write_back = write_back
        self.max_pending = max_pending
        self.writes = 0                           # entries written to the backing (puts and deletes)
        self.max_entries = max_entries
        self.entries: dict[int, int] = {}         # partition -> keys kept (written, not yet deleted)
        self.refused = 0                          # new keys not kept: their partition was full
        self.backing: MutableMapping[bytes, bytes] = {} if backing is None else backing
        self.partition = 0                       # the partition whose batch is being processed
        self.now_ns = 0                          # that partition's event time (streams/event_clock.py)
        self.delivery: Delivery | None = None    # where the event being processed was read (None: unknown)
        self._cache: dict[str, tuple[int, Any]] = {}
        self._home: dict[str, int | None] = {}    # partition of each key this batch read or wrote (None: deleted)
        self._dirty: dict[str, int] = {}          # key -> the partition it was written from
        self._deleted: dict[str, int] = {}       # key -> the partition it was deleted from
        self._pending: dict[str, tuple[int, bytes | None]] = {}   # write-back: key -> (partition, entry or None)
        self._in_backing: dict[str, bool] = {}   # write-back: whether the backing holds a key, as last read
        self._expiry: dict[int, list[tuple[int, str]]] = {}
        self._indexed: dict[str, int] = {}       # key -> the earliest expiry it has in the index
        self.expired = 0

    def _stored(self, key: str) -> bytes | None:
        """The stored bytes of a key this batch has not cached (pending, else the backing's); None if absent or
        deleted in this batch."""
        if key in self._deleted:
            return None
        pending = self._pending.get(key)
        if pending is not None:
            return pending[1]
        raw = self.backing.get(key.encode())
        if self.write_back:
            self._in_backing[key] = raw is not None
        return raw

    def get(self, key: str) -> Any | None:
        hit = self._cache.get(key)
        if hit is not None:
            return hit[1]
        raw = self._stored(key)
        if raw is None:
            self._home[key] = None                # absent: a put that follows need not read again
            return None
        expires, home = _HEADER.unpack_from(raw)
        value = self.codec.decode_state(raw[_HEADER.size:])
        self._cache[key] = (expires, value)
        self._home.setdefault(key, home)
        return value

    def _home_of(self, key: str) -> int | None:
        """The partition a key is counted under; None if it is not kept."""
        if key in self._home:
            return self._home[key]
        raw = self._stored(key)
        if raw is None:
            return None
        self._home[key] = home = _HEADER.unpack_from(raw)[1]
        return home

    def _count(self, partition: int, n: int) -> None:
        self.entries[partition] = max(0, self.entries.get(partition, 0) + n)

    def admits(self, key: str) -> bool:
        """Whether `put(key, ...)` would keep it: the key is kept already, or its partition has room."""
        return self._home_of(key) is not None or self.entries.get(self.partition, 0) < self.max_entries

    def put(self, key: str, value: Any, expires_ns: int, capped: bool = True) -> None:
        """Keep `value` (written at the next flush) until event time passes `expires_ns`. A new key is not kept
        when its partition holds `max_entries` already (counted in `refused`), unless `capped` is False: a key
        that belongs to one already kept (a timer of a kept link), bounded by those."""
        home = self._home_of(key)
        if home is None and capped and self.entries.get(self.partition, 0) >= self.max_entries:
            self.refused += 1
            return
        if home != self.partition:                # new, or rewritten from another partition: counted here now
            if home is not None:
                self._count(home, -1)
            self._count(self.partition, 1)
            self._home[key] = self.partition
        self._cache[key] = (expires_ns, value)
        self._dirty[key] = self.partition
        self._deleted.pop(key, None)
        self._index(key, expires_ns, self.partition)

    def _index(self, key: str, expires_ns: int, partition: int) -> None:
        """One index entry per key: a later expiry is found when the earlier one comes due (see expire)."""
        indexed = self._indexed.get(key)
        if indexed is None or expires_ns < indexed:
            self._indexed[key] = expires_ns
            heapq.heappush(self._expiry.setdefault(partition, []), (expires_ns, key))

    def delete(self, key: str) -> None:
        home = self._home_of(key)
        if home is not None:
            self._count(home, -1)
        self._home[key] = None                    # deleted in this batch: not kept
        self._cache.pop(key, None)
        self._dirty.pop(key, None)
        self._deleted[key] = self.partition

    def flush(self) -> None:
        """The end of a batch: its changes are encoded and written to the backing (write-back: kept pending), and
        the decoded entries forgotten."""
        changes: dict[str, tuple[int, bytes | None]] = {key: (p, None) for key, p in self._deleted.items()}
        for key, partition in self._dirty.items():
            expires, value = self._cache[key]
            changes[key] = (partition, _HEADER.pack(expires, partition) + self.codec.encode_state(value))
        if self.write_back:
            for key, (partition, entry) in changes.items():
                if entry is None and not self._in_backing.get(key, True):
                    self._pending.pop(key, None)   # made and deleted since the last write: nothing to write
                else:
                    self._pending[key] = (partition, entry)
            if len(self._pending) > self.max_pending:
                self.write_pending()
        else:
            self._write(changes)
        self._cache.clear()
        self._home.clear()
        self._dirty.clear()
        self._deleted.clear()

    def write_pending(self) -> int:
        """Write-back: write the pending entries to the backing, per partition in one go; how many there were."""
        pending = self._pending
        self._write(pending)     # cleared only once written: a write that fails loses nothing (the worker ends)
        self._pending = {}
        self._in_backing.clear()
        return len(pending)

    def drop_pending(self) -> int:
        """Forget the pending entries (the records that made them will be read again); how many there were."""
        n = len(self._pending)
        self._pending.clear()
        self._in_backing.clear()
        return n

    @property
    def pending(self) -> int:
        return len(self._pending)

    def _write(self, changes: dict[str, tuple[int, bytes | None]]) -> None:
        self.writes += len(changes)
        write = getattr(self.backing, "write", None)
        if write is None:                     # a plain mapping (tests, the in-memory pipeline)
            for key, (_, entry) in changes.items():
                if entry is None:
                    self.backing.pop(key.encode(), None)
                else:
                    self.backing[key.encode()] = entry
            return
        by_partition: dict[int, tuple[list[tuple[bytes, bytes]], list[bytes]]] = {}
        for key, (partition, entry) in changes.items():
            puts, deletes = by_partition.setdefault(partition, ([], []))
            if entry is None:
                deletes.append(key.encode())
            else:
                puts.append((key.encode(), entry))
        for partition, (puts, deletes) in sorted(by_partition.items()):
            write(partition, puts, deletes)

    def expire(self, now_ns: int) -> list[tuple[str, Any]]:
        """Remove and return this partition's entries that expire at or before `now_ns`."""
        heap = self._expiry.get(self.partition)
        out: list[tuple[str, Any]] = []
        while heap and heap[0][0] <= now_ns:
            expires, key = heapq.heappop(heap)
            if self._indexed.get(key) == expires:
                del self._indexed[key]
            current = self._expires_of(key)
            if current is None:
                continue   # deleted
            if current > now_ns:
                self._index(key, current, self.partition)   # rewritten with a later expiry since
                continue
            try:
                value = self.get(key)
            except Exception:  # noqa: BLE001 - an entry that does not decode is dropped, the others go on
                log.exception("state entry %r does not decode; dropped", key[:200])
                value = None
            out.append((key, value))
            self.delete(key)
        self.expired += len(out)
        return out

    def _expires_of(self, key: str) -> int | None:
        hit = self._cache.get(key)
        if hit is not None:
            return hit[0]
        raw = self._stored(key)
        return None if raw is None else _HEADER.unpack_from(raw)[0]

    def reload(self) -> None:
        """Rebuild the expiry index from the backing mapping (after recovery or a rebalance), and show the codec
        (the processor: Processor.restored) each entry. Entries still pending are dropped: their records were not
        committed, and are read again."""
        self.drop_pending()
        self._cache.clear()
        self._home.clear()
        self._dirty.clear()
        self._deleted.clear()
        self._expiry = {}
        self._indexed = {}
        self.entries = {}
        restored = getattr(self.codec, "restored", None)
        if restored is not None and getattr(type(self.codec), "restored", None) is Processor.restored:
            restored = None   # the default does nothing: no call per entry
        for k, raw in self.backing.items():
            expires, partition = _HEADER.unpack_from(raw)
            key = k.decode()
            if restored is not None:
                restored(partition, key, raw[_HEADER.size:])
            self._indexed[key] = expires
            self._expiry.setdefault(partition, []).append((expires, key))
            self.entries[partition] = self.entries.get(partition, 0) + 1
        for heap in self._expiry.values():
            heapq.heapify(heap)

    def __len__(self) -> int:
        return len(self.backing)
