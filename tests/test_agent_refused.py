"""The agent's accounting: events the publisher refuses are reported as refused, not delivered; events still
queued when a stuck sink outlives stop() are counted as dropped."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from clocktower.producers.agent.runner import AgentRunner
from clocktower.schemas.event import Event
from tests.event_samples import gpu_health
from tests.test_spool_resplit import FakeProducer, _open, _wait


def _gpu_batch() -> list[Event]:
    """Six readings; the fourth encodes to 868 bytes, the others to 465."""
    events: list[Event] = [gpu_health(ts_ns=time.time_ns() + i, gpu=i) for i in range(6)]
    events[3] = gpu_health(ts_ns=events[3].ts_ns, gpu=3, uuid="GPU-" + "x" * 250, nvlink_errors=list(range(18)),
                           throttle=["hw_slowdown"] * 8)
    return events


def test_events_the_publisher_refuses_are_not_reported_delivered(tmp_path: Path) -> None:
    fake = FakeProducer()
    pub = _open(tmp_path / "spool", fake, max_record_bytes=700)   # scaled down: the fourth event fits no record
    runner = AgentRunner([], pub.publish, flush_interval_s=0.01, refused=lambda: pub.refused)
    try:
        runner.start()
        runner.emit(_gpu_batch())
        _wait(lambda: sum(runner.delivered.values()) + sum(runner.refused.values()) == 6)
        runner.stop()
        assert pub.flush(10) == 0
        stats = pub.stats()
    finally:
        pub.close(timeout=0)
    report = runner.report()
    assert report["delivered"] == {"gpu_health": 5} and report["refused"] == {"gpu_health": 1}
    assert stats["refused"] == 1 and stats["acked"] == 5


def test_events_queued_behind_a_stuck_sink_at_stop_are_counted_dropped() -> None:
    entered, release = threading.Event(), threading.Event()
    taken: list[int] = []

    def stuck_sink(events: list[Event]) -> None:
        taken.append(len(events))
        entered.set()
        release.wait(10)

    runner = AgentRunner([], stuck_sink, flush_interval_s=0.01)
    runner.start()
    runner.emit([gpu_health(ts_ns=time.time_ns())])
    assert entered.wait(5)
    for i in range(3):
        runner.emit([gpu_health(ts_ns=time.time_ns() + i, gpu=g) for g in range(4)])
    runner.stop(timeout=0.2)
    assert runner.report()["dropped_events"] == 12, "still queued when stop() gave up on the sink"
    release.set()
    assert runner._thread is not None
    runner._thread.join(5)
    assert taken == [1] and runner.report()["delivered"] == {"gpu_health": 1}, "each event sent or dropped, once"
