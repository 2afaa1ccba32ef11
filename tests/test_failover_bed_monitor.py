"""The failover bed's PathMonitor answers from what it kept, says when it cannot, and never hides a dead reader."""

from __future__ import annotations

import threading

import pytest

from tests.failover_bed import PathMonitor


@pytest.fixture
def monitor():  # noqa: ANN201
    m = PathMonitor({}, ())   # no ports: the series are filled by hand below
    yield m
    m.close()


def test_bytes_are_counted_from_the_total_at_the_given_time(monitor: PathMonitor) -> None:
    monitor._changes["b", "p"] = [(10, 100), (20, 200), (30, 1300)]
    assert monitor.flow_start("b", "p", after_ns=20, timeout_s=0, min_bytes=1000) == 30
    assert monitor.flow_start("b", "p", after_ns=30, timeout_s=0, min_bytes=1) is None


def test_after_a_trim_the_base_is_the_newest_trimmed_total_not_zero(monitor: PathMonitor,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(monitor, "KEEP", 2)
    monitor._changes["b", "p"] = []
    monitor._add("b", "p", [(10, 100), (20, 4000), (30, 4900)])
    monitor._add("b", "p", [(40, 5000), (50, 5100)])         # 5 > 2 x KEEP: trimmed to (40, 50)
    assert monitor._changes["b", "p"] == [(40, 5000), (50, 5100)]
    assert monitor.flow_start("b", "p", after_ns=35, timeout_s=0, min_bytes=150) == 50   # was 40: base 0
    with pytest.raises(ValueError, match="older than"):
        monitor.flow_start("b", "p", after_ns=25, timeout_s=0, min_bytes=1)


def test_a_reader_that_died_is_raised_to_the_caller_not_a_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: PathMonitor) -> None:
        raise OSError(19, "No such device")

    monkeypatch.setattr(PathMonitor, "_read", broken)
    monkeypatch.setattr(threading, "excepthook", lambda args: None)   # the thread's own report: expected here
    m = PathMonitor({}, ())
    try:
        m._changes["b", "p"] = []
        m._thread.join(5)
        with pytest.raises(RuntimeError, match="reader failed"):
            m.flow_start("b", "p", after_ns=0, timeout_s=5)
    finally:
        m.close()
