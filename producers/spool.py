"""The on-disk queue behind SpoolingPublisher: bounded, append-only segment files, read back in order.

Layout of a spool directory:
  NNNNNNNNNN.seg   segments, numbered in write order; a new one is started at every open, so nothing is
                   ever appended after a torn tail left by a crash
  cursor           the highest seq below which every spooled record is acknowledged (text, replaced atomically)

A segment is a sequence of frames:
  header  magic "CTSP" | body length u32 | seq u64 | ts_ms u64 | crc32 u32      (big-endian, 28 bytes)
  body    topic len u16 | topic | key len i32 (-1: none) | key | header count u16 |
          per header: name len u16 | name | value len i32 (-1: none) | value   | record value (the rest)
  The CRC32 covers the length, seq, ts_ms and the body. A frame with a bad magic, a bad CRC or cut short
  (a crash mid-write) is skipped and counted: the reader resynchronises on the next magic whose frame checks.

Durability (fsync policy): every frame is written with one unbuffered write(2), so a crash of the process
loses nothing that `append` returned from. `sync()` fsyncs the segment being written and rewrites the
cursor; the owner calls it every `fsync_interval_s` (1 s in SpoolingPublisher), and it runs at every
segment roll and at `close()`. So only a crash of the whole machine (power, kernel) can lose the last
second of spooled records. A stale cursor after a crash only means some acknowledged records are read
back again; SpoolingPublisher checks those against the broker before resending them.

Bounded: when an append took the spool over `max_bytes`, whole segments are dropped, oldest first, and the
unacknowledged records in them are returned to the caller, which counts them. Dropping happens only after
the new record is written: on a full disk the write fails and nothing already spooled is given up for it.

Files: the directory is 0700 and must be ours; segments and the cursor are created O_EXCL|O_NOFOLLOW, 0600,
relative to a descriptor of the directory, so a planted link is never followed (producers/spool_dir.py).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import struct
import zlib
from bisect import bisect_right
from collections.abc import Container, Iterator
from dataclasses import dataclass
from pathlib import Path

from clocktower.producers.spool_dir import SpoolDir, SpoolDirUnsafe, SpoolInUse

__all__ = ["Spool", "SpoolDirUnsafe", "SpoolEntry", "SpoolInUse", "SpoolRecord", "encode_frame", "parse_frames"]

log = logging.getLogger(__name__)

MAGIC = b"CTSP"
_HEAD = struct.Struct(">4sIQQI")        # magic, body length, seq, ts_ms, crc32
_CRC_PART = struct.Struct(">IQQ")       # what the CRC covers besides the body
HEAD_SIZE = _HEAD.size
MAX_BODY = 64 * 1024 * 1024             # a larger length is corruption, not a record
COUNT_HEADER = "ct-count"
SCHEMA_HEADER = "ct-schema"

Headers = list[tuple[str, bytes | None]]


@dataclass
class SpoolRecord:
    """One Kafka record as spooled: where it goes, what it is, and its place in the order (seq)."""

    seq: int
    topic: str
    key: bytes | None
    value: bytes
    headers: Headers
    ts_ms: int

    @property
    def events(self) -> int:
        """Events the record carries (its ct-count header; 1 when absent or unreadable)."""
        for k, v in self.headers:
            if k == COUNT_HEADER and v is not None:
                try:
                    return int(v)
                except ValueError:
                    break
        return 1

    @property
    def schema(self) -> str:
        for k, v in self.headers:
            if k == SCHEMA_HEADER and v is not None:
                return v.decode("utf-8", "replace")
        return "unknown"

    def header(self, name: str) -> bytes | None:
        for k, v in self.headers:
            if k == name:
                return v
        return None


@dataclass
class SpoolEntry:
    """What the spool keeps in memory about each unacknowledged record."""

    seq: int
    segment: int
    events: int
    schema: str
    topic: str
    ts_ms: int
    size: int
    offset: int = 0


def encode_frame(rec: SpoolRecord) -> bytes:
    topic = rec.topic.encode()
    parts = [struct.pack(">H", len(topic)), topic]
    if rec.key is None:
        parts.append(struct.pack(">i", -1))
    else:
        parts += [struct.pack(">i", len(rec.key)), rec.key]
    parts.append(struct.pack(">H", len(rec.headers)))
    for name, val in rec.headers:
        n = name.encode()
        parts += [struct.pack(">H", len(n)), n]
        parts += [struct.pack(">i", -1)] if val is None else [struct.pack(">i", len(val)), val]
    parts.append(rec.value)
    body = b"".join(parts)
    crc = zlib.crc32(body, zlib.crc32(_CRC_PART.pack(len(body), rec.seq, rec.ts_ms)))
    return _HEAD.pack(MAGIC, len(body), rec.seq, rec.ts_ms, crc) + body


def _decode_body(seq: int, ts_ms: int, body: bytes) -> SpoolRecord:
    pos = 0

    def take(n: int) -> bytes:
        nonlocal pos
        if n < 0 or pos + n > len(body):
            raise ValueError("field runs past the frame")
        out = body[pos:pos + n]
        pos += n
        return out

    (tlen,) = struct.unpack(">H", take(2))
    topic = take(tlen).decode()
    (klen,) = struct.unpack(">i", take(4))
    key = None if klen == -1 else take(klen)
    (nh,) = struct.unpack(">H", take(2))
    headers: Headers = []
    for _ in range(nh):
        (nlen,) = struct.unpack(">H", take(2))
        name = take(nlen).decode()
        (vlen,) = struct.unpack(">i", take(4))
        headers.append((name, None if vlen == -1 else take(vlen)))
    return SpoolRecord(seq, topic, key, body[pos:], headers, ts_ms)


def parse_frames(buf: bytes) -> Iterator[tuple[int, int, SpoolRecord | None]]:
    """(start, end, record) for each frame in `buf`; record None for a corrupt or cut-short region."""
    pos, n = 0, len(buf)
    while pos < n:
        rec, end = _frame_at(buf, pos)
        if rec is not None:
            yield pos, end, rec
            pos = end
            continue
        nxt = pos + 1
        while True:                                   # resynchronise on the next frame that checks
            nxt = buf.find(MAGIC, nxt)
            if nxt < 0 or _frame_at(buf, nxt)[0] is not None:
                break
            nxt += 1
        end = n if nxt < 0 else nxt
        yield pos, end, None
        pos = end


def _frame_at(buf: bytes, pos: int) -> tuple[SpoolRecord | None, int]:
    if pos + HEAD_SIZE > len(buf):
        return None, len(buf)
    magic, blen, seq, ts_ms, crc = _HEAD.unpack_from(buf, pos)
    end = pos + HEAD_SIZE + blen
    if magic != MAGIC or blen > MAX_BODY or end > len(buf):
        return None, len(buf)
    body = buf[pos + HEAD_SIZE:end]
    if zlib.crc32(body, zlib.crc32(_CRC_PART.pack(blen, seq, ts_ms))) != crc:
        return None, end
    try:
        return _decode_body(seq, ts_ms, body), end
    except (ValueError, UnicodeDecodeError, struct.error):
        return None, end


@dataclass
class _Segment:
    number: int
    path: Path
    size: int

    @property
    def name(self) -> str:
        return self.path.name


def _segment_name(number: int) -> str:
    return f"{number:010d}.seg"


def _lock_dir(directory: SpoolDir) -> int:
    """An exclusive flock on `directory/lock`, held until close: two writers would interleave segments."""
    fd = directory.open_lock("lock")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        owner = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise SpoolInUse(f"spool directory {directory.path} is in use by another publisher (pid {owner}); "
                         "give each process its own spool directory") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


class Spool:
    """Append-only, bounded, ordered. `append`, `read_next`, `ack`; whole segments are deleted once acked."""

    def __init__(self, directory: str | os.PathLike[str], max_bytes: int = 256 * 1024 * 1024,
                 segment_bytes: int | None = None) -> None:
        self._dir = SpoolDir(directory)
        self.dir = self._dir.path
        try:
            self._lock_fd: int | None = _lock_dir(self._dir)
        except BaseException:
            self._dir.close()
            raise
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes or min(16 * 1024 * 1024, max(4096, max_bytes // 8))
        self.corrupt_records = 0          # corrupt or cut-short frames skipped (found at open or on read)
        self.cursor = self._read_cursor()
        self._segments: dict[int, _Segment] = {}
        self._index: list[SpoolEntry] = []              # from _head on: unacked (and acked-out-of-order) records,
        self._head = 0                                  # in seq order
        self._acked: set[int] = set()                   # acked seqs still inside _index
        self._by_seq: dict[int, SpoolEntry] = {}        # every entry of _index
        self._active: _Segment | None = None
        self._fd: int | None = None
        self._bytes = 0
        self.pending_records = 0
        self.pending_events = 0
        self._dirty = False
        self._cursor_written = self.cursor
        self._load()
        last = max((e.seq for e in self._index), default=0)
        self.next_seq = max(last, self.cursor) + 1

    # --- open ---------------------------------------------------------------
    def _read_cursor(self) -> int:
        try:
            return int(self._dir.read("cursor").decode().strip() or 0)
        except (OSError, ValueError):
            return 0

    def _load(self) -> None:
        for name in self._dir.names(".seg"):
            path = self.dir / name
            try:
                number = int(path.stem)
                buf = self._dir.read(name)
            except (ValueError, OSError) as exc:
                log.warning("spool: ignoring %s: %s", path, exc)
                continue
            seg = _Segment(number, path, len(buf))
            for start, _end, rec in parse_frames(buf):
                if rec is None:
                    self.corrupt_records += 1
                    log.warning("spool: skipped a corrupt or cut-short record in %s at byte %d", path.name, start)
                    continue
                if rec.seq <= self.cursor or rec.seq in self._by_seq:
                    continue
                self._add_entry(SpoolEntry(rec.seq, number, rec.events, rec.schema, rec.topic, rec.ts_ms,
                                           _end - start, start))
            self._segments[number] = seg
            self._bytes += seg.size
        self._index.sort(key=lambda e: e.seq)
        self._delete_acked_segments()

    def _live(self) -> bool:
        return self._head < len(self._index)

    def _popleft(self) -> SpoolEntry:
        e = self._index[self._head]
        self._head += 1
        if self._head > 4096 and self._head * 2 > len(self._index):   # compact now and then
            del self._index[:self._head]
            self._head = 0
        return e

    def _add_entry(self, e: SpoolEntry) -> None:
        self._index.append(e)
        self._by_seq[e.seq] = e
        self.pending_records += 1
        self.pending_events += e.events

    # --- write --------------------------------------------------------------
    def append(self, rec: SpoolRecord) -> list[SpoolEntry]:
        """Write `rec` at the tail; returns the unacknowledged entries dropped to make room (oldest first).

        A record larger than the whole spool is itself dropped (returned) and not written. Older segments are
        dropped only once `rec` is written: when the write fails (OSError, e.g. a full disk) nothing is."""
        frame = encode_frame(rec)
        entry = SpoolEntry(rec.seq, -1, rec.events, rec.schema, rec.topic, rec.ts_ms, len(frame))
        if len(frame) > self.max_bytes:
            return [entry]
        over = self._bytes + len(frame) > self.max_bytes
        if self._active is None or self._active.size >= self.segment_bytes or (over and self._active.size):
            self._roll()                       # over budget: a fresh segment, so every older one can be dropped
        assert self._active is not None and self._fd is not None
        try:
            written = os.write(self._fd, frame)
        except OSError:
            written = -1
            raise
        finally:
            if written != len(frame):          # a full disk or an I/O error: no torn frame stays behind
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, self._active.size)
        if written != len(frame):
            raise OSError(errno.ENOSPC, f"short write to the spool ({written} of {len(frame)} bytes)")
        entry.segment, entry.offset = self._active.number, self._active.size
        self._active.size += len(frame)
        self._bytes += len(frame)
        self._add_entry(entry)
        self.next_seq = max(self.next_seq, rec.seq + 1)
        self._dirty = True
        dropped: list[SpoolEntry] = []
        while self._bytes > self.max_bytes and min(self._segments) != self._active.number:
            dropped += self._drop_oldest_segment()
        return dropped

    def _roll(self) -> None:
        self._close_active(sync=True)
        number = max(self._segments, default=0) + 1
        for _ in range(64):
            try:
                self._fd = self._dir.create(_segment_name(number), os.O_WRONLY | os.O_APPEND)
                break
            except FileExistsError:            # not ours to write: something was put there; step over it
                log.warning("spool: %s already exists and was not created by this spool; skipping it",
                            self.dir / _segment_name(number))
                number += 1
        else:
            raise OSError(errno.EEXIST, f"spool {self.dir}: 64 segment names in a row are taken")
        self._active = _Segment(number, self.dir / _segment_name(number), 0)
        self._segments[number] = self._active

    def _close_active(self, sync: bool) -> None:
        if self._fd is not None:
            if sync:
                os.fsync(self._fd)
            os.close(self._fd)
        self._fd = None
        self._active = None

    def _drop_oldest_segment(self) -> list[SpoolEntry]:
        number = min(self._segments)
        seg = self._segments.pop(number)
        if self._active is seg:
            self._close_active(sync=False)
        dropped = []
        while self._live() and self._index[self._head].segment == number:
            e = self._popleft()
            del self._by_seq[e.seq]
            if e.seq in self._acked:
                self._acked.discard(e.seq)
            else:
                dropped.append(e)
                self.pending_records -= 1
                self.pending_events -= e.events
            self.cursor = max(self.cursor, e.seq)
        self._bytes -= seg.size
        self._unlink(seg)
        return dropped

    def _unlink(self, seg: _Segment) -> None:
        self._dir.unlink(seg.name)
        self._dirty = True

    # --- acknowledge ------------------------------------------------------------
    def ack(self, seq: int) -> bool:
        """Mark a spooled record delivered; returns False when it is not (or no longer) in the spool."""
        if seq <= self.cursor or seq in self._acked:
            return False
        entry = self._by_seq.get(seq)
        if entry is None:
            return False
        self._acked.add(seq)
        self.pending_records -= 1
        self.pending_events -= entry.events
        while self._live() and self._index[self._head].seq in self._acked:
            e = self._popleft()
            del self._by_seq[e.seq]
            self._acked.discard(e.seq)
            self.cursor = e.seq
        self._dirty = True
        self._delete_acked_segments()
        return True

    def _delete_acked_segments(self) -> None:
        first_live = self._index[self._head].segment if self._live() else None
        for number in sorted(self._segments):
            if first_live is not None and number >= first_live:
                break
            seg = self._segments[number]
            if seg is self._active:
                if first_live is None:           # everything acked: retire the active segment too
                    self._close_active(sync=False)
                else:
                    break
            del self._segments[number]
            self._bytes -= seg.size
            self._unlink(seg)

    # --- read ---------------------------------------------------------------
    def read_next(self, after_seq: int, skip: Container[int] = ()) -> SpoolRecord | None:
        """The first unacknowledged record with seq > after_seq and not in `skip`, or None."""
        i = bisect_right(self._index, after_seq, lo=self._head, key=lambda e: e.seq)
        while i < len(self._index):
            e = self._index[i]
            i += 1
            if e.seq in self._acked or e.seq in skip:
                continue
            rec = self._read(e)
            if rec is not None:
                return rec
        return None

    def _read(self, e: SpoolEntry) -> SpoolRecord | None:
        seg = self._segments.get(e.segment)
        rec = None
        if seg is not None:
            try:
                rec, _ = _frame_at(self._dir.read(seg.name, e.offset, e.size), 0)
            except OSError as exc:
                log.warning("spool: cannot read %s: %s", seg.path, exc)
        if rec is not None and rec.seq == e.seq:
            return rec
        # it checked when written or opened but not now (the file changed underneath): count it, let it go
        self.corrupt_records += 1
        log.warning("spool: record %d in segment %d is unreadable now; skipped", e.seq, e.segment)
        self.ack(e.seq)
        return None

    def entries(self) -> list[SpoolEntry]:
        """The unacknowledged entries, oldest first."""
        return [e for e in self._index[self._head:] if e.seq not in self._acked]

    # --- durability -----------------------------------------------------------
    @property
    def bytes(self) -> int:
        return self._bytes

    def sync(self) -> None:
        """fsync the segment being written and persist the cursor (when anything changed)."""
        if not self._dirty:
            return
        if self._fd is not None:
            os.fsync(self._fd)
        if self.cursor != self._cursor_written:
            self._dir.replace("cursor", f"{self.cursor}\n".encode())
            self._cursor_written = self.cursor
        self._dir.fsync()                      # segment creations, deletions and the cursor rename
        self._dirty = False

    def close(self) -> None:
        self.sync()
        self._close_active(sync=True)
        if self._lock_fd is not None:
            os.close(self._lock_fd)           # releases the flock
            self._lock_fd = None
        self._dir.close()
