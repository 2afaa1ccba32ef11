"""The node agent's runner and `clocktower agent` CLI: sources on/off with reasons, batching to one sink,
drop-oldest when the queue is full, and two real agents exchanging clock probes through the kernel."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter

from clocktower import agent_cli
from clocktower.ports import free_port
from clocktower.producers.agent.config import AgentSettings
from clocktower.producers.agent.factory import UnavailableSource
from clocktower.producers.agent.runner import AgentRunner
from clocktower.producers.agent.source import Availability, Emit
from clocktower.producers.spool import Spool
from clocktower.schemas.event import Event
from clocktower.schemas.telemetry import ClockProbe, LinkState
from tests.test_cli import _env, assert_one_error_line, clocktower

T0 = time.time_ns()


def _link(i: int) -> LinkState:
    return LinkState(node="n", ts_ns=T0 + i, interface="eth0", kind="ethernet", up=True, carrier_changes=i,
                     speed_mbps=0, operstate="up", carrier=True)


class CountingSource:
    """Emits `n` LinkState events from its own thread, in batches of 10."""

    name = "count"

    def __init__(self, n: int) -> None:
        self.n = n
        self.counts: Counter[str] = Counter()
        self.thread: threading.Thread | None = None

    def check(self) -> Availability:
        return Availability(True, "always")

    def start(self, emit: Emit) -> None:
        def run() -> None:
            for i in range(0, self.n, 10):
                batch = [_link(j) for j in range(i, min(i + 10, self.n))]
                self.counts["link_state"] += len(batch)
                emit(batch)
        self.thread = threading.Thread(target=run)
        self.thread.start()

    def stop(self) -> None:
        assert self.thread is not None
        self.thread.join()


def test_runner_delivers_everything_in_order_from_one_thread_and_reports_off_sources() -> None:
    got: list[Event] = []
    threads: set[str] = set()

    def sink(events: list[Event]) -> None:
        threads.add(threading.current_thread().name)
        got.extend(events)

    runner = AgentRunner([CountingSource(1000), UnavailableSource("gpu", "NVML library not found")], sink,
                         flush_interval_s=0.02)
    runner.start()
    assert runner.wait_started(5)
    time.sleep(0.2)
    runner.stop()
    assert [e.carrier_changes for e in got] == list(range(1000))
    assert threads == {"agent-delivery"}
    report = runner.report()
    count = report["sources"]["count"]
    assert count.pop("start_s") < 1
    assert count == {"enabled": True, "state": "running", "reason": "always", "events": {"link_state": 1000}}
    assert report["sources"]["gpu"]["enabled"] is False and report["sources"]["gpu"]["state"] == "off"
    assert report["sources"]["gpu"]["reason"] == "NVML library not found"
    assert report["delivered"] == {"link_state": 1000} and report["dropped_events"] == 0


def test_runner_drops_oldest_when_the_sink_stalls_and_counts_it() -> None:
    release = threading.Event()
    got: list[Event] = []

    def slow_sink(events: list[Event]) -> None:
        release.wait(10)
        got.extend(events)

    runner = AgentRunner([CountingSource(500)], slow_sink, flush_interval_s=0.01, max_queued_batches=5,
                         max_batch_events=10)
    runner.start()
    time.sleep(0.3)
    release.set()
    runner.stop()
    assert runner.dropped_events > 0
    assert len(got) + runner.dropped_events == 500          # nothing lost without being counted
    assert got[-1].carrier_changes == 499                    # the newest survive


class OneShotSource:
    """Emits the events it is given, when told to, from the caller's thread."""

    name = "one-shot"
    counts: Counter[str] = Counter()

    def check(self) -> Availability:
        return Availability(True, "always")

    def start(self, emit: Emit) -> None:
        self.emit = emit

    def stop(self) -> None:
        pass


def test_an_urgent_event_is_handed_to_the_sink_at_once_not_at_the_flush_interval() -> None:
    got: list[tuple[float, list[Event]]] = []
    src = OneShotSource()
    runner = AgentRunner([src], lambda events: got.append((time.monotonic(), events)), flush_interval_s=5.0,
                         urgent=agent_cli._urgent)   # what `clocktower agent` gives its runner
    runner.start()
    assert runner.wait_started(5)
    try:
        src.emit([_link(1)])                                    # not urgent: waits for the 5 s interval
        time.sleep(0.05)
        sent = time.monotonic()
        src.emit([_link(2).model_copy(update={"up": False})])   # urgent: ends the gathering
        deadline = time.monotonic() + 2
        while not got and time.monotonic() < deadline:
            time.sleep(0.005)
        assert got, "the urgent event waited for the flush interval"
        at, events = got[0]
        assert [e.carrier_changes for e in events] == [1, 2]    # what was gathered goes with it, in order
        assert at - sent < 1.0
    finally:
        runner.stop()


def test_sink_errors_are_counted_not_fatal() -> None:
    calls = Counter()

    def failing(events: list[Event]) -> None:
        calls["n"] += 1
        raise RuntimeError("broker away")

    runner = AgentRunner([CountingSource(50)], failing, flush_interval_s=0.01)
    runner.start()
    time.sleep(0.1)
    runner.stop()
    assert runner.sink_errors == calls["n"] >= 1 and runner.delivered == {}
    assert runner.dropped_events == 50                     # every event the sink refused is counted


def test_agent_cli_rejects_bad_input(tmp_path) -> None:  # noqa: ANN001
    assert_one_error_line(clocktower("agent", "--sources", "gpu,bogus", "--stdout"), "bogus")
    held = Spool(tmp_path / "spool")              # another publisher owns this spool directory
    try:
        assert_one_error_line(clocktower("agent", "--kafka", "127.0.0.1:1", "--duration", "1", "--spool-dir",
                                         str(tmp_path / "spool")), "in use", "--spool-dir")
    finally:
        held.close()
    assert_one_error_line(clocktower("agent", "--stdout", "--json"), "--duration")
    assert_one_error_line(clocktower("agent", "--stdout", "--duration", "0"), "--duration")
    assert_one_error_line(clocktower("agent", "--stdout", "--duration", "1", "--gpu-hz", "-1"), "gpu_hz")


def test_clock_source_needs_a_safe_key_and_a_cluster_bind(tmp_path) -> None:  # noqa: ANN001
    """No key: the clock source is off and says why. `--gen-clock-key` writes a 0600 key once; a key readable
    by others is refused; a wildcard bind needs --clock-bind-any."""
    peer = ("--clock-peer", f"127.0.0.1:{free_port()}")
    run = ("agent", "--stdout", "--duration", "0.5", "--json", "--sources", "clock", *peer)
    report = json.loads(clocktower(*run).stdout)
    assert report["sources"]["clock"]["enabled"] is False
    assert "no clock key" in report["sources"]["clock"]["reason"] and "--gen-clock-key" in \
        report["sources"]["clock"]["reason"]

    key = tmp_path / "clock.key"
    made = clocktower("agent", "--gen-clock-key", str(key))
    assert made.returncode == 0, made.stderr
    assert key.stat().st_mode & 0o777 == 0o600 and len(key.read_bytes().strip()) == 64
    first = key.read_bytes()
    assert_one_error_line(clocktower("agent", "--gen-clock-key", str(key)), "already exists")
    assert key.read_bytes() == first                         # never overwritten

    report = json.loads(clocktower(*run, "--clock-key-file", str(key), "--clock-bind", "127.0.0.1:0").stdout)
    assert report["sources"]["clock"]["enabled"] is True, report
    report = json.loads(clocktower(*run, "--clock-bind", "127.0.0.1:0",
                                   env=_env(CLOCKTOWER_CLOCK_KEY_FILE=str(key))).stdout)
    assert report["sources"]["clock"]["enabled"] is True, report   # the key file from the environment
    report = json.loads(clocktower(*run, "--clock-key-file", str(key), "--clock-bind", "0.0.0.0:0").stdout)
    assert report["sources"]["clock"]["enabled"] is False, report   # off, saying why; the agent still runs
    assert "every interface" in report["sources"]["clock"]["reason"]
    assert "--clock-bind-any" in report["sources"]["clock"]["reason"]
    report = json.loads(clocktower(*run, "--clock-key-file", str(key), "--clock-bind", "0.0.0.0:0",
                                   "--clock-bind-any").stdout)
    assert report["sources"]["clock"]["enabled"] is True, report

    key.chmod(0o644)
    report = json.loads(clocktower(*run, "--clock-key-file", str(key)).stdout)
    assert report["sources"]["clock"]["enabled"] is False and "chmod 600" in report["sources"]["clock"]["reason"]


def test_a_clock_source_the_probe_agent_refuses_is_off_and_says_why(tmp_path) -> None:  # noqa: ANN001
    from clocktower.producers.agent.clock_source import ClockProbeSource
    from clocktower.producers.clock.key import generate_key_file

    key = generate_key_file(tmp_path / "clock.key")
    src = ClockProbeSource("n", None, ("127.0.0.1:7373",), key_file=key, interface="ct-nosuch0")
    off = src.check()
    assert off.ok is False and "ct-nosuch0" in off.reason and "has no IPv4 address" in off.reason


def test_no_route_to_the_clock_peer_at_boot_leaves_the_other_sources_running(tmp_path) -> None:  # noqa: ANN001
    """In a fresh network namespace (only a down loopback) the route lookup for the first clock peer fails:
    the clock source is off with that reason, the agent runs its other sources and exits 0."""
    import os
    import shutil
    import subprocess
    import sys

    if os.geteuid() != 0 or shutil.which("unshare") is None:
        import pytest
        pytest.skip("needs root and unshare(1) to create a network namespace with no routes")
    key = tmp_path / "clock.key"
    assert clocktower("agent", "--gen-clock-key", str(key)).returncode == 0
    r = subprocess.run(["unshare", "-n", sys.executable, "-m", "clocktower", "agent", "--stdout", "--duration", "0.5",
                        "--json", "--sources", "clock,links", "--clock-peer", "10.255.0.1:7373",
                        "--clock-key-file", str(key)], capture_output=True, text=True, env=_env(), timeout=60,
                       stdin=subprocess.DEVNULL)
    if r.returncode != 0 and "unshare failed" in r.stderr:
        import pytest
        pytest.skip(f"cannot create a network namespace here: {r.stderr.strip()}")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout.splitlines()[-1])
    clock = report["sources"]["clock"]
    assert clock["enabled"] is False and "no route to clock peer 10.255.0.1:7373" in clock["reason"], report
    assert report["sources"]["links"]["enabled"] is True, report


def test_two_agents_exchange_clock_probes_and_report_counts(tmp_path) -> None:  # noqa: ANN001
    """Two `clocktower agent --stdout` processes probe each other; the JSON lines and the final counts agree."""
    import subprocess
    import sys

    key = tmp_path / "clock.key"
    assert clocktower("agent", "--gen-clock-key", str(key)).returncode == 0
    pa, pb = free_port(), free_port()
    procs = []
    for node, own, peer in (("a", pa, pb), ("b", pb, pa)):
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "clocktower", "agent", "--node", node, "--stdout", "--duration", "3", "--json",
             "--sources", "clock,gpu", "--clock-bind", f"127.0.0.1:{own}", "--clock-peer", f"127.0.0.1:{peer}",
             "--clock-key-file", str(key)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env()))
    for node, proc in zip("ab", procs, strict=True):
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        lines = [json.loads(line) for line in out.splitlines()]
        report, batches = lines[-1], lines[:-1]
        assert report["node"] == node
        assert report["sources"]["clock"]["enabled"] is True
        assert report["sources"]["gpu"]["enabled"] is False and "NVML" in report["sources"]["gpu"]["reason"]
        probes = [e for b in batches for e in b["events"]]
        assert all(b["topic"] == "telemetry.clock" and b["schema"] == "clock_probe" for b in batches)
        assert len(probes) == report["delivered"]["clock_probe"] == report["sources"]["clock"]["events"][
            "clock_probe"] >= 20
        assert {(p["sender"], p["receiver"]) for p in probes} == {("b" if node == "a" else "a", node)}
        assert "clock" in err and "running" in err      # the status table on stderr


def test_agent_stops_cleanly_on_sighup() -> None:
    """A closed terminal (SIGHUP) stops `clocktower agent` like SIGTERM: sources stopped, exit 0, no traceback."""
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "clocktower", "agent", "--stdout", "--sources", "links"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not proc.stdout.readline():   # the first link report: running
            pass
        proc.send_signal(signal.SIGHUP)
        _out, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "Traceback" not in err


def test_agent_with_the_broker_away_spools_and_stops_promptly(tmp_path) -> None:  # noqa: ANN001
    """No broker: the agent's events go to the spool, and stopping does not wait on a delivery that can't
    happen."""
    import subprocess
    import sys

    from clocktower.producers.spool import Spool

    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "clocktower", "agent", "--kafka", f"127.0.0.1:{free_port()}", "--sources", "links",
         "--duration", "1", "--json", "--spool-dir", str(tmp_path / "spool")],
        capture_output=True, text=True, env=_env(), timeout=60)
    elapsed = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    links = report["delivered"]["link_state"]
    assert report["publisher"]["broker_up"] is False and report["publisher"]["spool_events"] == links >= 1
    assert elapsed < 20, f"took {elapsed:.1f} s to stop"
    spool = Spool(tmp_path / "spool")                  # left for the next run to replay
    assert spool.pending_events == links
    spool.close()


def test_agent_kafka_port_is_the_broker_on_this_host(tmp_path) -> None:  # noqa: ANN001
    """`--kafka-port P`, as the other commands take it, publishes to 127.0.0.1:P: a listener there sees the
    agent's producer connect. With --kafka too it is one error line; a bad port is one error line."""
    import socket

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.settimeout(30)
    connected: list[tuple[str, int]] = []
    accepting = threading.Thread(target=lambda: connected.append(listener.accept()[1]), daemon=True)
    accepting.start()
    try:
        r = clocktower("agent", "--kafka-port", str(port), "--sources", "links", "--duration", "1", "--json",
                       "--spool-dir", str(tmp_path / "spool"))
        accepting.join(10)
    finally:
        listener.close()
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["kafka"] == f"127.0.0.1:{port}"
    assert connected and connected[0][0] == "127.0.0.1"
    assert report["publisher"]["spool_events"] == report["delivered"]["link_state"] >= 1   # no broker: spooled
    assert_one_error_line(clocktower("agent", "--kafka", "127.0.0.1:9092", "--kafka-port", "9093", "--duration",
                                     "1"), "--kafka", "--kafka-port")
    assert_one_error_line(clocktower("agent", "--kafka-port", "0", "--duration", "1"), "kafka_port")


def test_the_agent_sends_only_a_link_going_down_at_once() -> None:
    down = _link(2).model_copy(update={"up": False})
    assert agent_cli._urgent(down) and not agent_cli._urgent(_link(1))
    assert not agent_cli._urgent(ClockProbe(node="n", ts_ns=T0, pair_id=1, idx=0, sender="m", receiver="n",
                                            tx_ns=T0, rx_ns=T0))


def test_the_agents_publisher_does_not_linger(monkeypatch, tmp_path) -> None:  # noqa: ANN001
    """The runner batches already; librdkafka's linger would only delay the urgent down it sends at once."""
    seen: dict = {}
    monkeypatch.setattr(agent_cli, "SpoolingPublisher", lambda *a, **kw: seen.update(kw))
    agent_cli._publisher("127.0.0.1:9", AgentSettings(spool_dir=tmp_path))
    assert seen["extra_config"]["linger.ms"] == agent_cli.AGENT_LINGER_MS == 0
