"""Acknowledged records the broker lost after their hold ran out: counted, since they cannot be resent.

The ack hold (producers/ack_hold.py) keeps each acked record for `ack_hold_s` and resends it if the broker goes
away meanwhile and turns out to have lost it. A broker can lose more than that: the embedded one acknowledges
before it writes, and a kill -9 was seen to lose 15 s of acked records (issue 18, finding 6), and a local user
can widen that window by growing its store. No fixed hold covers it, so what the hold let go is remembered here
by where it landed (topic, partition, offset) and its ct-rid. When the broker is back, the publisher reads those
offsets again: a record that is no longer there, or whose offset now holds another record (the broker handed
the offset out again), was acknowledged and lost. Those are counted (`acked_lost_records`, `acked_lost_events`
in the publisher's stats) and logged; they are not resent, since the spool no longer has them.

Only releases of the last `window_s` before the broker went away are checked (and at most `max_entries` are
remembered): a broker persists what it acked long before that.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

TopicPartitionKey = tuple[str, int]


@dataclass(frozen=True)
class Released:
    released_at: float    # monotonic seconds
    topic: str
    partition: int
    offset: int
    rid: bytes
    events: int


class ReleasedAcks:
    def __init__(self, window_s: float = 120.0, max_entries: int = 200_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self.clock = clock
        self._released: deque[Released] = deque(maxlen=max_entries)

    def __len__(self) -> int:
        return len(self._released)

    def released(self, topic: str, partition: int, offset: int, rid: bytes | None, events: int) -> None:
        """An acked record at `offset` is no longer held: if the broker loses it, it is lost."""
        if rid is not None and offset >= 0:
            self._released.append(Released(self.clock(), topic, partition, offset, rid, events))

    def to_check(self, went_away: float | None = None) -> tuple[list[Released], dict[TopicPartitionKey, int]]:
        """The releases to check, those of the `window_s` before the broker went away (at `went_away`, monotonic;
        default now), and per topic-partition the first offset to read back for them. Older ones are forgotten."""
        cutoff = (self.clock() if went_away is None else went_away) - self.window_s
        while self._released and self._released[0].released_at < cutoff:
            self._released.popleft()
        snapshot = list(self._released)
        first: dict[TopicPartitionKey, int] = {}
        for r in snapshot:
            tp = (r.topic, r.partition)
            first[tp] = min(first.get(tp, r.offset), r.offset)
        return snapshot, first

    def lost(self, checked: list[Released], found: dict[TopicPartitionKey, dict[int, bytes | None]],
             deleted_below: Mapping[TopicPartitionKey, int] | None = None) -> list[Released]:
        """Of `checked` (to_check's snapshot), those whose offset, read back (`found`: offset -> ct-rid per
        topic-partition read), no longer holds their record. Every checked release is forgotten: the lost ones'
        offsets are handed out again, and the others are stored. Releases made during the read are kept for the
        next check, and a topic-partition missing from `found` was not read: its releases are kept too. A release
        below `deleted_below` (read_rids: the log now starts there) is not lost: the broker deleted it, which the
        embedded one does only once every reader has read it (clocktower/log_trim.py)."""
        floor = deleted_below or {}
        judged = [r for r in checked if (r.topic, r.partition) in found]
        lost = [r for r in judged if r.offset >= floor.get((r.topic, r.partition), 0)
                and found[(r.topic, r.partition)].get(r.offset) != r.rid]
        gone = set(map(id, judged))
        self._released = deque((r for r in self._released if id(r) not in gone), maxlen=self._released.maxlen)
        return lost


def read_rids(consumer: Consumer, first: dict[TopicPartitionKey, int], ct_rid: str, limit: int,
              timeout_s: float = 30.0, deleted_below: dict[TopicPartitionKey, int] | None = None,
              ) -> dict[TopicPartitionKey, dict[int, bytes | None]]:
    """offset -> ct-rid of every record from `first` to the end, per topic-partition (`consumer`: assigned here).
    Where the log now starts past `first` (the broker deleted records: retention, or the embedded broker's
    consumed records), it is read from its start, which is noted in `deleted_below` when given; without it, such
    a topic-partition is left out, so not judged.
    Raises when the broker does not answer, or when more than `limit` records would have to be read."""
    found: dict[TopicPartitionKey, dict[int, bytes | None]] = {}
    ends: dict[TopicPartitionKey, int] = {}
    assign = []
    for (topic, partition), start in first.items():
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
        if start < low:
            if deleted_below is None:
                continue          # some were deleted: this topic-partition is not judged (not read)
            deleted_below[(topic, partition)] = start = low
        found[(topic, partition)] = {}
        if start < high:
            ends[(topic, partition)] = high
            assign.append(TopicPartition(topic, partition, start))
    total = sum(ends[(tp.topic, tp.partition)] - tp.offset for tp in assign)
    if total > limit:
        raise RuntimeError(f"{total} records to read back, over the limit of {limit}")
    if not assign:
        return found
    consumer.assign(assign)   # the consumer resets an offset deleted meanwhile to the earliest (the callers' config)
    deadline = time.monotonic() + timeout_s
    while ends:
        if time.monotonic() > deadline:
            raise TimeoutError(f"reading back {sorted(ends)} took over {timeout_s:.0f} s")
        for m in consumer.consume(1000, timeout=0.2):
            if m.error() is not None:
                if m.error().code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(m.error())
                ends.pop((m.topic(), m.partition()), None)   # the end: offsets past it are not coming
                continue
            tp = (m.topic(), m.partition())
            found.setdefault(tp, {})[m.offset()] = next((v for k, v in m.headers() or () if k == ct_rid), None)
            if tp in ends and m.offset() >= ends[tp] - 1:
                del ends[tp]
    if deleted_below is not None:   # records deleted while this read ran were not read: note where the log starts now
        for (topic, partition), start in first.items():
            if (topic, partition) in found:
                low = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)[0]
                if low > start:
                    deleted_below[(topic, partition)] = max(deleted_below.get((topic, partition), 0), low)
    return found
