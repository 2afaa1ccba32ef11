"""Delete what every reader has committed from the embedded broker, which rewrites its whole log every few seconds.

noida-db (the embedded broker) keeps every record in memory and saves its whole state as one JSON file, each byte
written as a decimal number, about every 10 s, on one thread ("autosave"). Measured here: 50, 100 and 150 MB of
records kept cost that thread 15, 36 and 55 % of a core, and a pipeline fed 9.4k events/s adds about 26 MB a
minute, so within minutes the broker's saves take a core and the pipeline falls behind (issue 19's soak). Topics
keep a day and more of telemetry (schemas/topics.py); nothing here reaches a retention limit.

So, with the embedded broker only, `clocktower up` and `demo` delete every partition's records below the point
that every consumer group reading it has committed (topic_admin.READERS: the sink and the streams), as Kafka
Streams purges its repartition topics. Kept on purpose:
- the record just below each group's committed offset: the sink reads it back on every assignment to check
  that the broker lost nothing (sinks/clickhouse/resume.py);
- the last `keep_s` seconds of every partition (by this process's clock): a person may still look at recent
  records, and a producer's spool reads back what it sent just before an outage to find what already arrived
  (producers/spooling_publisher.py). Limit: a spool replaying after an outage longer than `keep_s` no longer
  finds the records it sent before it that every reader has since consumed, so it sends them again and they are
  stored twice. Records the broker deleted here count as arrived for the lost-ack check (producers/lost_acks.py);
- partitions not every reader has committed yet (a reader that never started protects everything);
- topics someone reads outside those groups: analytics.clock (every stream worker reads all of it at start,
  streams/clock_broadcast.py) and the control topics (the actuators; those are capped by `retention.bytes`).
A Kafka broker keeps its retention as configured: nothing is deleted there.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping

from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from clocktower.schemas.topics import TOPICS
from clocktower.streams.clock_broadcast import TOPIC as CLOCK_TOPIC
from clocktower.topic_admin import READERS, consumer_lag

log = logging.getLogger(__name__)

Part = tuple[str, int]
PASS_TIMEOUT_S = 5.0       # each broker request of a pass: a stopping stack waits for no longer
# Read by someone outside the groups in READERS (see the module doc).
OUTSIDE_READERS = frozenset({CLOCK_TOPIC} | {t.name for t in TOPICS if t.retention_bytes is not None})


def trimmable(readers: Mapping[str, Iterable[str]] = READERS) -> dict[str, tuple[str, ...]]:
    """topic -> the groups that must have committed a record before it is deleted."""
    out: dict[str, list[str]] = {}
    for group, topics in readers.items():
        for topic in topics:
            if topic not in OUTSIDE_READERS:
                out.setdefault(topic, []).append(group)
    return {t: tuple(g) for t, g in out.items()}


def trim_points(lag_rows: Iterable[Mapping], readers: Mapping[str, Iterable[str]],
                kept_from: Mapping[Part, int]) -> dict[Part, int]:
    """Per partition, the offset below which records may be deleted: one below the lowest committed offset of
    every group in `readers[topic]`, and not past `kept_from` (the partition's end keep_s seconds ago).

    `lag_rows`: topic_admin.consumer_lag's rows (group, topic, partition, committed). A partition with a reader
    that has no commit, or no row at all, or no `kept_from`, gets no point."""
    committed: dict[Part, dict[str, int | None]] = {}
    for r in lag_rows:
        committed.setdefault((r["topic"], r["partition"]), {})[r["group"]] = r["committed"]
    out: dict[Part, int] = {}
    for part, by_group in committed.items():
        groups = readers.get(part[0])
        if not groups or part not in kept_from:
            continue
        offsets = [by_group.get(g) for g in groups]
        if any(o is None for o in offsets):
            continue
        point = min(min(offsets) - 1, kept_from[part])   # type: ignore[type-var]  # None ruled out above
        if point > 0:
            out[part] = point
    return out


class LogTrimmer(threading.Thread):
    """Every `interval_s`, delete what every reader has committed (see the module doc); a failed pass is logged
    and tried again at the next one. `deleted` counts the records deleted so far.

    "The last `keep_s` seconds" is measured on this process's clock, not on the producers' timestamps (a node
    whose clock is behind, or a spool replaying old records, would make new records look old): each pass notes
    every partition's end, and a pass deletes nothing past the ends noted `keep_s` or more ago."""

    def __init__(self, bootstrap: str, interval_s: float, keep_s: float,
                 readers: Mapping[str, Iterable[str]] = READERS, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(name="log-trim", daemon=True)
        self.bootstrap, self.interval_s, self.keep_s, self.clock = bootstrap, interval_s, keep_s, clock
        self.readers = trimmable(readers)
        self.lag_readers = {g: tuple(ts) for g, ts in readers.items()}
        self.deleted = 0
        self._ends: deque[tuple[float, dict[Part, int]]] = deque()   # (when, each partition's end then)
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(self.interval_s):
            try:
                self.trim_once()
            except Exception as exc:  # noqa: BLE001 - a pass that fails is retried; the broker keeps everything
                if not self._halt.is_set():
                    log.warning("could not delete consumed records from the embedded broker: %s", exc)

    def stop(self, timeout: float = 10.0) -> None:
        self._halt.set()
        if self.is_alive():
            self.join(timeout)

    def trim_once(self) -> int:
        """One pass; returns the records it deleted."""
        rows = [r for r in consumer_lag(self.bootstrap, self.lag_readers, timeout=PASS_TIMEOUT_S)
                if r["topic"] in self.readers]
        now = self.clock()
        self._ends.append((now, {(r["topic"], r["partition"]): r["end"] for r in rows}))
        kept_from: dict[Part, int] = {}
        while self._ends and self._ends[0][0] <= now - self.keep_s:   # the newest ends at least keep_s old
            kept_from = self._ends.popleft()[1]
        if kept_from:
            self._ends.appendleft((now - self.keep_s, kept_from))      # still the bound until a newer one ages
        # never past a partition's end now (a broker that lost records gives their offsets again)
        current = self._ends[-1][1]
        kept_from = {part: min(end, current[part]) for part, end in kept_from.items() if part in current}
        points = trim_points(rows, self.readers, kept_from)
        if not points or self._halt.is_set():
            return 0
        lows = {(r["topic"], r["partition"]): r["start"] for r in rows}
        todo = [TopicPartition(t, p, o) for (t, p), o in points.items() if o > lows[(t, p)]]
        if not todo:
            return 0
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 4})
        n = 0
        for tp, fut in admin.delete_records(todo, request_timeout=PASS_TIMEOUT_S).items():
            try:
                low = fut.result(PASS_TIMEOUT_S).low_watermark
            except Exception as exc:  # noqa: BLE001 - one partition's failure leaves it for the next pass
                log.warning("could not delete %s[%d] below %d: %s", tp.topic, tp.partition, tp.offset, exc)
                continue
            n += max(0, low - lows[(tp.topic, tp.partition)])
        self.deleted += n
        log.debug("deleted %d consumed records (%d so far)", n, self.deleted)
        return n
