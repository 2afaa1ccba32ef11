"""Fixes to Faust's consumer internals (faust-streaming 0.15.3, aiokafka 0.14), each working around one upstream bug.

Faust drops records it has fetched whenever a rebalance is under way (flow stopped, partitions paused, the
generation changed, agents' buffers cleared) and relies on one thing to read them again: `perform_seek()`, which
seeks every partition back to its committed offset at the end of the rebalance. aiokafka's `seek_to_committed`
seeks only where an offset above 0 was committed, so a partition nobody ever committed kept the position after
the dropped records: they were never read again (a stall at the high watermark), or later records were read and
committed past the hole (a silent loss). Seen in the kill test of tests/test_scale_out.py, issue 17.

A second race (seen in loaded kill-test runs: records of a partition never handled, its commits stuck below them):
Faust's recovery resumes flow *before* it runs that seek, so a batch fetched just before the seek may still be
handed on after it. Each of those records, and the one a slow agent was taking while the seek ran, set Faust's read
offset past the records the seek asked for again, and `_drain_messages` then dropped those as below the read offset
("DROPPED MESSAGE ROFF"). So a record that aiokafka will return again (its position is at or below the record) is
not handed on, and a read offset set by a record the seek asked for again is cleared (None: take the next record).
A first attempt put the seek's read offsets back but still handed the rest of the stale batch on: Faust then saw a
gap between the read offset and those records, marked it done, and the duplicates it later added to its acked list
held commits back one offset per commit (3 of 8 loaded kill-test runs stalled).

A fourth: a table partition whose local store has persisted an offset past its changelog's end (the broker lost
records in a kill -9: the embedded broker's durability) made every recovery raise ConsistencyError, and the worker
crash-looped (24 restarts, nothing detected; issue 18). Such a partition's local store is dropped and recovered
from the changelog, as a new worker's would be, with one WARNING line.

A third: `Consumer.on_partitions_revoked` forgets the acked offsets of revoked partitions before it runs the app's
handler that commits, so every record acked since the last periodic commit was read again by the partition's next
owner (duplicates). The acked offsets are committed first.

`install()` applies every fix below to each Faust consumer started afterwards. tests/test_faust_fixes.py drives
each through Faust's real consumer against the embedded broker, with and without it.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition
from faust.tables.recovery import Recovery
from faust.transport.consumer import Consumer
from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread
from faust.types import TP

log = logging.getLogger(__name__)

_original_seek_to_committed = AIOKafkaConsumerThread.seek_to_committed
_original_getmany = Consumer.getmany
_original_wait_next_records = Consumer._wait_next_records
_original_perform_seek = Consumer.perform_seek
_original_on_partitions_revoked = Consumer.on_partitions_revoked
_original_build_offsets = Recovery._build_offsets
skip_sought_back = True   # the second fix (off only in tests/test_faust_fixes.py, to show the race without it)


def position(consumer: AIOKafkaConsumer, tp: TopicPartition) -> int | None:
    """aiokafka's position of `tp` (the next offset it hands out), or None while it has none (not assigned, or an
    offset reset pending). Call it on the consumer's own thread: unlike `position()`, it never waits."""
    subscription = consumer._subscription.subscription
    assignment = subscription.assignment if subscription is not None else None
    if assignment is None or tp not in assignment.tps:
        return None
    try:
        state = assignment.state_value(tp)
    except KeyError:   # unassigned since the check (read from the event loop while the consumer's thread runs)
        return None
    return state.position if state.has_valid_position else None


def comes_again(consumer: AIOKafkaConsumer, tp: TP, offset: int) -> bool:
    """Whether aiokafka will return the record at `offset` again: a seek since it was fetched moved the position to
    it or below. (Only Faust's fetch loop moves positions forward, so during a batch this holds until it ends.)"""
    pos = position(consumer, tp)
    return pos is not None and pos <= offset


async def rewind_never_committed(consumer: AIOKafkaConsumer, acked: Callable[[str], bool]) -> Mapping[TP, int]:
    """aiokafka's seek_to_committed, and then every partition of an acked topic with no commit above 0 is sought to
    its log start. Upstream bug: seek_to_committed skips offsets None and 0, so records Faust dropped on such a
    partition (fetched during a rebalance) were skipped for good. Runs on the consumer's thread."""
    committed = await consumer.seek_to_committed()
    fresh = [tp for tp, offset in committed.items() if not offset and acked(tp.topic)]
    if fresh:
        starts = await consumer.beginning_offsets(fresh)
        for tp in fresh:
            pos = position(consumer, tp)
            if pos is None or pos != starts[tp]:
                if pos is not None:
                    log.info("%s:%d was never committed and read up to %d: rewound to its start %d",
                             tp.topic, tp.partition, pos, starts[tp])
                consumer.seek(tp, starts[tp])
    return committed


async def _seek_to_committed(self: AIOKafkaConsumerThread) -> Mapping[TP, int]:
    acked = self.app.topics.acks_enabled_for
    return await self.call_thread(rewind_never_committed, self._ensure_consumer(), acked)


async def _wait_next_records(self: Consumer, timeout: float) -> tuple[Any, Any]:
    records, active = await _original_wait_next_records(self, timeout)
    self.clocktower_fetched = records
    self.clocktower_seeks_at_fetch = getattr(self, "clocktower_seeks", 0)   # seeks made after this fetch count
    return records, active


async def _getmany(self: Consumer, timeout: float) -> AsyncIterator[tuple[TP, Any]]:
    """Faust's getmany, less the records a seek since their fetch asked for again (upstream hands them on and they
    move the read offset past the records the seek asked for), and noting what it fetched and did not hand on: Faust
    drops those records without a word."""
    self.clocktower_fetched = None
    handed: dict[TP, int] = {}
    consumer = self._thread._ensure_consumer()
    sought_back = False
    async for tp, message in _original_getmany(self, timeout):
        if skip_sought_back and comes_again(consumer, tp, message.offset):
            sought_back = True
            continue
        handed[tp] = message.offset
        yield tp, message
        if skip_sought_back and comes_again(consumer, tp, message.offset):
            # sought back while it was handed on: Faust's fetch loop just set the read offset past the records the
            # seek asked for again, and would drop them
            self._read_offset[tp] = None
    fetched, self.clocktower_fetched = self.clocktower_fetched, None
    acked = self.app.topics.acks_enabled_for   # (a changelog's records are the recovery's: it seeks them itself)
    dropped = {tp: span for tp, span in discarded(fetched or {}, handed).items() if acked(tp.topic)}
    if not dropped:
        return
    why = ("a seek since the fetch asked for them again" if sought_back else "flow stopped" if not self.flow_active
           else "flow stopped, partition paused or generation changed")
    for tp, (first, last) in dropped.items():
        log.info("Faust discarded %s:%d offsets %d-%d (%s); the seek to committed offsets must read them again",
                 tp.topic, tp.partition, first, last, why)
    pending = getattr(self, "clocktower_discarded", {})
    for tp, (first, _last) in dropped.items():
        pending[tp] = min(first, pending.get(tp, first))
    self.clocktower_discarded = pending
    seeks = getattr(self, "clocktower_seeks_at_fetch", 0)
    if sought_back or getattr(self, "clocktower_seeks", 0) != seeks:   # sought back since the fetch: check now
        await check_discards_rewound(self)   # (else the seek at the rebalance's end does)


def discarded(fetched: Mapping[TP, list], handed: Mapping[TP, int]) -> dict[TP, tuple[int, int]]:
    """Per partition, the first and last offsets fetched but not handed on (`handed`: the last offset handed on)."""
    out = {}
    for tp, records in fetched.items():
        if not records or records[-1].offset <= handed.get(tp, -1):   # all handed on: the usual case, checked fast
            continue
        left = [r.offset for r in records if r.offset > handed.get(tp, -1)]
        if left:
            out[tp] = (left[0], left[-1])
    return out


async def _perform_seek(self: Consumer) -> None:
    await _original_perform_seek(self)
    self.clocktower_seeks = getattr(self, "clocktower_seeks", 0) + 1
    if getattr(self, "clocktower_discarded", None):
        await check_discards_rewound(self)


async def check_discards_rewound(self: Consumer) -> None:
    """WARNING for every partition whose discarded records the last seek left behind its position: they are lost
    unless something reads them again. A partition no longer assigned is its new owner's (read from the commit)."""
    pending, self.clocktower_discarded = self.clocktower_discarded, {}
    thread = self._thread

    async def positions(consumer: AIOKafkaConsumer) -> dict[TP, int | None]:
        return {tp: position(consumer, tp) for tp in pending}

    try:
        now = await thread.call_thread(positions, thread._ensure_consumer())
    except Exception:  # noqa: BLE001 - a report that fails (the consumer stopping) must not break Faust's fetch loop
        log.warning("could not check that discarded records are read again", exc_info=True)
        return
    for tp, pos in now.items():
        if pos is not None and pos > pending[tp]:
            log.warning("records of %s:%d from offset %d were discarded by Faust and not read again: the "
                        "position is %d", tp.topic, tp.partition, pending[tp], pos)


async def _on_partitions_revoked(self: Consumer, revoked: set[TP]) -> None:
    """Commit what is acked, then Faust's revoke. Upstream bug: it forgets the acked offsets of the revoked
    partitions before the app's handler commits, so their next owner read every record acked since the last
    periodic commit again."""
    try:
        await self.commit()
    except Exception:  # noqa: BLE001 - a failed commit means duplicates, as upstream; the revoke must go on
        log.warning("could not commit the acked offsets before a revoke: their records will be read again",
                    exc_info=True)
    await _original_on_partitions_revoked(self, revoked)


async def _build_offsets(self: Recovery, consumer: Any, tps: set[TP], destination: Any, title: str) -> None:
    """Faust's, after dropping the local store of every partition that is ahead of its changelog (upstream
    bug: recovery raises ConsistencyError for it on every start, and the worker crash-loops)."""
    stored = [tp for tp in tps if destination.get(tp) is not None]
    if stored:
        highwaters = await consumer.highwaters(*stored)
        for tp in stored:
            last = (highwaters.get(tp) or 0) - 1
            if destination[tp] > last:
                table = self.tp_to_table[tp]
                log.warning("the local store of %s (%s:%d) is at changelog offset %d, past the changelog's last "
                            "offset %d (the broker lost records): dropped, recovering it from the changelog",
                            table.name, tp.topic, tp.partition, destination[tp], last)
                drop_local_partition(table.data, tp.partition)
                destination[tp] = None
    await _original_build_offsets(self, consumer, tps, destination, title)


def drop_local_partition(store: Any, partition: int) -> None:
    """Remove one partition of a table's local store (a rocksdb one; a memory store persists nothing): closed,
    its files deleted, opened afresh and empty on next use."""
    dbs = getattr(store, "_dbs", None)
    if dbs is None:
        return
    db = dbs.pop(partition, None)
    if db is not None:
        db.close()
    shutil.rmtree(store.partition_path(partition), ignore_errors=True)
    store._key_index.clear()   # key -> partition, now stale


def install() -> None:
    """Apply the fixes to every Faust consumer (they patch classes: call before the app starts)."""
    AIOKafkaConsumerThread.seek_to_committed = _seek_to_committed
    Consumer._wait_next_records = _wait_next_records
    Consumer.getmany = _getmany
    Consumer.perform_seek = _perform_seek
    Consumer.on_partitions_revoked = _on_partitions_revoked
    Recovery._build_offsets = _build_offsets


def uninstall() -> None:
    """Faust as upstream ships it (the tests show what happens without the fixes)."""
    AIOKafkaConsumerThread.seek_to_committed = _original_seek_to_committed
    Consumer._wait_next_records = _original_wait_next_records
    Consumer.getmany = _original_getmany
    Consumer.perform_seek = _original_perform_seek
    Consumer.on_partitions_revoked = _original_on_partitions_revoked
    Recovery._build_offsets = _original_build_offsets
