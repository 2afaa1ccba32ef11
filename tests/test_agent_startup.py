"""The agent starts its sources in parallel: a slow start (BCC's 7-13 s compile) never delays another
source's events, a start that hangs is given up after the bound, and `--duration` counts from when the
sources are running, not from the process start. Fake sources whose start sleeps stand in for BCC."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter

import pytest

from clocktower import agent_cli, cli
from clocktower.producers.agent.runner import AgentRunner
from clocktower.producers.agent.source import Availability, Emit
from clocktower.schemas.event import Event
from clocktower.schemas.telemetry import LinkState


class TickingSource:
    """Optionally slow to start (`start_delay`, or blocked until `release`); then one event every `tick_s`."""

    def __init__(self, name: str, *, start_delay: float = 0.0, release: threading.Event | None = None,
                 tick_s: float = 0.02) -> None:
        self.name = name
        self.start_delay = start_delay
        self.release = release
        self.tick_s = tick_s
        self.counts: Counter[str] = Counter()
        self.started_at: float | None = None       # when start() returned
        self.stopped = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._emit: Emit | None = None

    def check(self) -> Availability:
        return Availability(True, f"fake {self.name}")

    def start(self, emit: Emit) -> None:
        if self.release is not None:
            self.release.wait(10)
        time.sleep(self.start_delay)
        self._emit = emit
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self.started_at = time.monotonic()

    def _run(self) -> None:
        while not self._stop.wait(self.tick_s):
            self._send()

    def _send(self) -> None:
        assert self._emit is not None
        self.counts["link_state"] += 1
        self._emit([LinkState(node="n", ts_ns=time.time_ns(), interface=self.name, kind="ethernet", up=True,
                              carrier_changes=0, speed_mbps=0, operstate="up", carrier=True)])

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._send()                                 # a last report at stop, as the flow source's final drain
        self.stopped.set()


class Received:
    """A sink that notes when each interface's events reached it."""

    def __init__(self) -> None:
        self.at: dict[str, list[float]] = {}
        self.lock = threading.Lock()

    def __call__(self, events: list[Event]) -> None:
        now = time.monotonic()
        with self.lock:
            for e in events:
                self.at.setdefault(e.interface, []).append(now)   # type: ignore[attr-defined]

    def count(self, name: str) -> int:
        with self.lock:
            return len(self.at.get(name, []))


def _wait(what: str, ready, timeout: float = 5.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_a_slow_start_does_not_delay_the_other_sources() -> None:
    release = threading.Event()
    slow, fast = TickingSource("slow", release=release), TickingSource("fast")
    sink = Received()
    runner = AgentRunner([slow, fast], sink, flush_interval_s=0.01)     # the slow one first, as flows,links
    t0 = time.monotonic()
    runner.start()
    started = time.monotonic()            # the runner's own clock starts inside start(), between t0 and this
    assert started - t0 < 0.5                                            # start() does not wait for any source
    try:
        _wait("the fast source's events while the slow one starts", lambda: sink.count("fast") >= 5)
        assert runner.status["slow"].state == "starting" and runner.status["fast"].state == "running"
        assert not runner.wait_started(0)
        assert runner.report()["sources"]["slow"]["enabled"] is False
        released = time.monotonic()
        release.set()
        assert runner.wait_started(5)
    finally:
        release.set()
        runner.stop()
    assert runner.status["slow"].state == "running"
    assert slow.started_at is not None and runner.startup_s is not None
    # The runner rounds to ms; round() keeps order, and its clock started no later than `started`.
    since_release = round(released - started, 3)
    assert runner.status["slow"].start_s >= since_release and runner.startup_s >= since_release
    assert sum(1 for at in sink.at["fast"] if at < released) >= 5        # delivered during the slow start
    assert slow.stopped.is_set() and sink.count("slow") == slow.counts["link_state"] >= 1


def test_a_source_that_hangs_starting_is_given_up_after_the_bound() -> None:
    release = threading.Event()
    hung, fast = TickingSource("hung", release=release), TickingSource("fast")
    sink = Received()
    runner = AgentRunner([hung, fast], sink, flush_interval_s=0.01, start_timeout_s=0.3)
    t0 = time.monotonic()
    runner.start()
    try:
        assert runner.wait_started(3)
        assert 0.3 <= time.monotonic() - t0 < 2
        report = runner.report()["sources"]
        assert report["hung"]["state"] == "failed" and report["hung"]["enabled"] is False
        assert "did not start within 0.3 s" in report["hung"]["error"]
        assert report["fast"]["state"] == "running"
        release.set()                                   # it finishes starting late: stopped, not left running
        assert hung.stopped.wait(5)
        assert runner.status["hung"].state == "failed"
    finally:
        release.set()
        runner.stop()
    assert sink.count("fast") >= 5


def test_stop_while_a_source_starts_stops_it_once_started_and_delivers_its_events() -> None:
    slow = TickingSource("slow", start_delay=0.5)
    sink = Received()
    runner = AgentRunner([slow], sink, flush_interval_s=0.01)
    runner.start()
    time.sleep(0.05)
    runner.stop()                                       # waits for the start (within the bound), then stops it
    assert slow.stopped.is_set()
    st = runner.status["slow"]
    assert st.state == "off" and "stopped before" in st.reason
    assert sink.count("slow") == slow.counts["link_state"] >= 1 and runner.dropped_events == 0


def test_duration_counts_from_when_the_sources_are_running(monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """`clocktower agent --duration 0.6` with a source that takes 1 s to start: the slow source runs its
    0.6 s too, and the table on stderr says at once that it is starting, then when it runs."""
    slow, fast = TickingSource("slow", start_delay=1.0, tick_s=0.05), TickingSource("fast", tick_s=0.05)
    monkeypatch.setattr(agent_cli, "build_sources", lambda settings, topology=None: [slow, fast])
    monkeypatch.setattr(agent_cli.signal, "signal", lambda *args: None)   # leave pytest's handlers alone
    t0 = time.monotonic()
    assert cli.main(["agent", "--stdout", "--duration", "0.6", "--json"]) == 0
    elapsed = time.monotonic() - t0
    out, err = capsys.readouterr()
    report = json.loads(out.splitlines()[-1])
    assert report["sources"]["slow"]["events"]["link_state"] >= 8, report  # ~0.6 s / 0.05 s, plus the last one
    assert elapsed >= 1.6
    assert report["startup_s"] >= 1.0 and 0.6 <= report["seconds"] < 1.0, report
    assert report["sources"]["slow"]["state"] == "running" and report["sources"]["slow"]["start_s"] >= 1.0
    assert report["delivered"]["link_state"] == slow.counts["link_state"] + fast.counts["link_state"]
    table, _, after = err.partition("source slow: running after 1.")
    assert after, err                                                       # a line when it became ready
    assert "starting" in table and "slow" in table and "running" in table   # the first table: slow starting
