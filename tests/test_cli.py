"""The `clocktower` command line, run as separate processes the way a user runs it.

One `clocktower up` is shared by the tests of this module (a module fixture); the tests that need it
running come first, then it is stopped with SIGINT and checked for a clean exit, and the data it left
is read again without it. Error paths must print exactly one `error:` line and exit 2.
"""

from __future__ import annotations

import contextlib
import csv
import fcntl
import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from clocktower import stack as stack_module
from clocktower.ports import free_port
from clocktower.producers.kafka_publisher import KafkaPublisher
from clocktower.runtime.errors import UserError
from clocktower.schemas.telemetry import LinkState
from clocktower.schemas.topics import TOPICS

HOST = "127.0.0.1"
CLI_TIMEOUT = 60.0
LINKS_PUBLISHED = 3


def _env(**extra: str) -> dict[str, str]:
    """The caller's environment without CLOCKTOWER_* settings, and a narrow terminal so a wrapped line shows."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLOCKTOWER_")}
    return {**env, "COLUMNS": "40", "PYTHONUNBUFFERED": "1", **extra}


def clocktower(*args: str, env: dict[str, str] | None = None,
               timeout: float = CLI_TIMEOUT) -> subprocess.CompletedProcess[str]:
    """Run the CLI to completion; past `timeout` stop it and whatever it started, and fail."""
    proc = subprocess.Popen([sys.executable, "-m", "clocktower", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env or _env(), stdin=subprocess.DEVNULL)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_tree(proc, descendants(proc.pid), timeout=30)
        out, err = proc.communicate()
        raise AssertionError(f"`clocktower {' '.join(args)}` ran past {timeout:.0f} s\n{out}\n{err}") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def assert_one_error_line(r: subprocess.CompletedProcess[str], *fragments: str) -> str:
    assert r.returncode == 2, f"exit {r.returncode}\nstdout: {r.stdout}\nstderr: {r.stderr}"
    assert "Traceback" not in r.stderr + r.stdout, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), f"want one `error:` line, got {lines}"
    for fragment in fragments:
        assert fragment in lines[0], f"{fragment!r} not in {lines[0]!r}"
    return lines[0]


def wait_for(what: str, ready: Callable[[], bool], timeout: float, alive: Callable[[], bool] = lambda: True,
             why: Callable[[], str] = lambda: "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        if not alive():
            raise AssertionError(f"gave up waiting for {what}: the process exited. {why()}")
        time.sleep(0.2)
    raise AssertionError(f"{what} not within {timeout:.0f} s. {why()}")


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((HOST, port)) == 0


def _proc_stat(pid: int | str) -> list[str] | None:
    """/proc/PID/stat after the command name: [state, ppid, ...]; field 19 of the list is the start time."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def descendants(pid: int) -> dict[int, str]:
    """Every live process below `pid` with its start time (children run in their own sessions, not our group)."""
    stats = {int(e.name): st for e in Path("/proc").iterdir() if e.name.isdigit() and (st := _proc_stat(e.name))}
    found: dict[int, str] = {}
    frontier = {pid}
    while frontier:
        frontier = {p for p, st in stats.items() if int(st[1]) in frontier and p not in found}
        found.update({p: stats[p][19] for p in frontier})
    return found


def alive(pid: int, started: str) -> bool:
    """True while that very process (not a later one with its pid) runs and is no zombie."""
    st = _proc_stat(pid)
    return st is not None and st[19] == started and st[0] != "Z"


def stop_tree(proc: subprocess.Popen, below: dict[int, str], timeout: float) -> list[int]:
    """SIGINT `proc` as Ctrl-C does, SIGKILL it past `timeout`; then SIGKILL any of `below` still running
    and return those: a clean stop leaves none."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    leftover = [pid for pid, started in below.items() if alive(pid, started)]
    for pid in leftover:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return leftover


def lock_is_free(data_dir: Path) -> bool:
    fd = os.open(data_dir / "clocktower.lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # closing drops our probe lock too
    return True


@dataclass
class Up:
    """A `clocktower up` process on its own data dir and ports."""

    data_dir: Path
    kafka_port: int
    http_port: int
    proc: subprocess.Popen[bytes] | None = None
    children: dict[int, str] = field(default_factory=dict)
    exit_code: int | None = None
    stop_seconds: float | None = None
    leftover: list[int] = field(default_factory=list)

    @property
    def flags(self) -> list[str]:
        return ["--data-dir", str(self.data_dir), "--kafka-port", str(self.kafka_port),
                "--http-port", str(self.http_port)]

    def output(self) -> str:
        logs = "".join(f"\n--- {p.name}: " + "\n".join(p.read_text(errors="replace").splitlines()[-5:])
                       for p in sorted((self.data_dir / "logs").glob("*.log")))
        return (f"up stdout: {(self.data_dir.parent / 'up.out').read_text(errors='replace')}\n"
                f"up stderr: {(self.data_dir.parent / 'up.err').read_text(errors='replace')}{logs}")

    def start(self) -> None:
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        with open(self.data_dir.parent / "up.out", "wb") as out, open(self.data_dir.parent / "up.err", "wb") as err:
            # Started with SIGINT ignored, as `nohup` or `cmd &` in a script leave it: Ctrl-C must still stop it.
            self.proc = subprocess.Popen([sys.executable, "-m", "clocktower", "up", *self.flags], stdout=out,
                                         stderr=err, stdin=subprocess.DEVNULL, env=_env(),
                                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_ready(self, timeout: float = 60) -> None:
        wait_for("owner.json", (self.data_dir / "owner.json").exists, timeout, self.running, self.output)
        wait_for("`query SELECT 1`", lambda: clocktower("query", "SELECT 1", *self.flags).returncode == 0,
                 timeout, self.running, self.output)
        pid = self.proc.pid  # type: ignore[union-attr]
        wait_for("the broker, endpoint, sink and streams processes", lambda: len(descendants(pid)) >= 4, timeout,
                 self.running, self.output)
        self.children = descendants(pid)

    def stop(self, timeout: float = 45) -> None:
        """SIGINT, as Ctrl-C does; then SIGKILL for `up` and anything below it still running."""
        if self.proc is None or self.exit_code is not None:
            return
        below = {**self.children, **descendants(self.proc.pid)}
        t0 = time.monotonic()
        self.leftover = stop_tree(self.proc, below, timeout)
        self.stop_seconds = time.monotonic() - t0
        self.exit_code = self.proc.returncode


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    u = Up(tmp_path_factory.mktemp("up") / "ct", free_port(), free_port())
    u.start()
    try:
        u.wait_ready()
        yield u
    finally:
        u.stop()


@pytest.fixture(scope="module")
def link_rows(up: Up) -> int:
    """Publish a few link states through the running broker and wait until the sink stored them."""
    owner = json.loads((up.data_dir / "owner.json").read_text())
    publisher = KafkaPublisher(owner["kafka"])
    now = time.time_ns()
    publisher.publish([LinkState(node=f"node-{i}", ts_ns=now + i, interface="eth0", kind="ethernet", up=True,
                                 carrier_changes=i, speed_mbps=0, operstate="up",
                                 carrier=True) for i in range(LINKS_PUBLISHED)])
    assert publisher.flush(30) == 0 and not publisher.failed

    def stored() -> bool:
        r = clocktower("query", "SELECT count() FROM link_states", "--format", "csv", *up.flags)
        return r.returncode == 0 and r.stdout.splitlines()[1:] == [str(LINKS_PUBLISHED)]

    wait_for("the sink to store the published link states", stored, 45, up.running, up.output)
    return LINKS_PUBLISHED


@pytest.fixture(scope="module")
def stopped(up: Up, link_rows: int) -> Up:
    """The shared `up`, after data went through it, stopped with SIGINT."""
    up.stop()
    return up


# --- while `up` runs ------------------------------------------------------------------------------------------


def test_query_reaches_the_running_owner_in_every_format(up: Up, link_rows: int) -> None:
    sql = "SELECT count() AS n FROM link_states"
    table = clocktower("query", sql, *up.flags)
    assert table.returncode == 0, table.stderr
    assert "n" in table.stdout and str(link_rows) in table.stdout

    as_json = clocktower("query", sql, "--format", "json", *up.flags)
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout) == [{"n": link_rows}]

    as_csv = clocktower("query", "SELECT node, up FROM link_states ORDER BY node", "--format", "csv", *up.flags)
    assert as_csv.returncode == 0, as_csv.stderr
    rows = list(csv.reader(io.StringIO(as_csv.stdout)))
    assert rows == [["node", "up"], *([f"node-{i}", "true"] for i in range(link_rows))]  # ClickHouse's CSV


def test_topics_shows_lag_per_group_topic_and_partition(up: Up, link_rows: int) -> None:
    def sink_rows() -> dict[tuple[str, int], dict]:
        r = clocktower("topics", "--json", *up.flags)
        assert r.returncode == 0, r.stderr
        return {(row["topic"], row["partition"]): row for row in json.loads(r.stdout)
                if row["group"] == "clocktower-sink"}

    wait_for("the sink to commit the link states", lambda: sink_rows()[("telemetry.links", 0)]["lag"] == 0, 30)
    rows = sink_rows()
    assert set(rows) == {(t.name, p) for t in TOPICS for p in range(t.partitions)}  # the sink reads every topic
    links = rows[("telemetry.links", 0)]
    assert links["end"] >= link_rows and links["committed"] == links["end"]
    for row in rows.values():
        assert row["lag"] == row["end"] - (row["committed"] or 0) >= 0

    table = clocktower("topics", *up.flags)  # a narrow terminal: every column still there
    assert table.returncode == 0, table.stderr
    assert all(word in table.stdout for word in ("group", "partition", "committed", "lag", "telemetry.links"))


def test_bad_sql_through_the_endpoint_is_one_clickhouse_error_line(up: Up) -> None:
    line = assert_one_error_line(clocktower("query", "SELEC 1", *up.flags))
    assert "Syntax error" in line or "Code: 62" in line, line


def test_second_up_on_an_owned_data_dir_says_in_use(up: Up) -> None:
    other = list(up.flags)
    other[3], other[5] = str(free_port()), str(free_port())  # its own ports: only the data dir collides
    assert_one_error_line(clocktower("up", *other, timeout=30), "in use", str(up.data_dir))
    assert up.running() and (up.data_dir / "owner.json").exists(), "the refused `up` must not disturb the owner"


def test_up_generates_private_logins_that_the_endpoint_checks(up: Up) -> None:
    creds = up.data_dir / "credentials.json"
    assert (up.data_dir.stat().st_mode & 0o777, creds.stat().st_mode & 0o777) == (0o700, 0o600)
    assert (up.data_dir / "control.key").stat().st_mode & 0o777 == 0o600
    assert (up.data_dir / "producer.key").stat().st_mode & 0o777 == 0o600   # `up`'s streams check node signatures
    told = "".join((up.data_dir.parent / "up.out").read_text().split())  # rich wraps the line at 40 columns
    assert "".join(str(creds).split()) in told and "'dashboards'" in told, "`up` must say where the logins are"
    users = json.loads(creds.read_text())["users"]
    wrong = clocktower("query", "SELECT 1", *up.flags, env=_env(CLOCKTOWER_CLICKHOUSE_PASSWORD="guess"))
    assert "AUTHENTICATION_FAILED" in assert_one_error_line(wrong, "516")
    dashboards = _env(CLOCKTOWER_CLICKHOUSE_USER="dashboards",
                      CLOCKTOWER_CLICKHOUSE_PASSWORD=users["dashboards"]["password"])
    r = clocktower("query", "SELECT 7", *up.flags, env=dashboards)
    assert r.returncode == 0 and "7" in r.stdout, r.stderr
    assert "READONLY" in assert_one_error_line(clocktower("query", "DROP TABLE link_states", *up.flags,
                                                          env=dashboards))


# --- after SIGINT ---------------------------------------------------------------------------------------------


def test_sigint_stops_up_and_all_its_children(stopped: Up) -> None:
    assert stopped.exit_code == 0, stopped.output()
    assert stopped.stop_seconds is not None and stopped.stop_seconds < 30
    assert "Traceback" not in stopped.output()
    assert not stopped.leftover, "children outlived `up`"
    assert not listening(stopped.kafka_port) and not listening(stopped.http_port)
    assert not (stopped.data_dir / "owner.json").exists()
    assert lock_is_free(stopped.data_dir), "a second `up` on this data dir could not start"


def test_query_after_stop_opens_the_data_dir_itself(stopped: Up, link_rows: int) -> None:
    r = clocktower("query", "SELECT count() AS n FROM link_states", "--format", "json", *stopped.flags)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == [{"n": link_rows}]
    # the chdb path reports bad SQL the same way
    assert_one_error_line(clocktower("query", "SELEC 1", *stopped.flags), "Syntax error")
    assert_one_error_line(clocktower("topics", *stopped.flags), "no broker is running")


# --- errors without a running `up` ------------------------------------------------------------------------------


def test_up_on_a_busy_port_says_which(tmp_path: Path) -> None:
    kafka_port, http_port = free_port(), free_port()
    with socket.socket() as busy:
        busy.bind((HOST, kafka_port))
        busy.listen()
        r = clocktower("up", "--data-dir", str(tmp_path / "ct"), "--kafka-port", str(kafka_port),
                       "--http-port", str(http_port), timeout=30)
    assert_one_error_line(r, "in use", str(kafka_port), "--kafka-port")
    assert lock_is_free(tmp_path / "ct") and not listening(http_port)


@pytest.mark.parametrize("make_dir", [False, True], ids=["missing", "empty"])
def test_query_without_data_says_so(tmp_path: Path, make_dir: bool) -> None:
    data_dir = tmp_path / "ct"
    if make_dir:
        data_dir.mkdir()
    assert_one_error_line(clocktower("query", "SELECT 1", "--data-dir", str(data_dir)), "no ClickHouse data")


def test_topics_without_a_running_broker_says_so(tmp_path: Path) -> None:
    assert_one_error_line(clocktower("topics", "--data-dir", str(tmp_path)), "no broker is running")


def test_bad_configuration_is_one_line(tmp_path: Path) -> None:
    r = clocktower("query", "SELECT 1", "--data-dir", str(tmp_path), env=_env(CLOCKTOWER_CLICKHOUSE_URL="ftp://x"))
    assert_one_error_line(r, "bad configuration", "CLOCKTOWER_CLICKHOUSE_URL", "ftp://x")
    r = clocktower("up", "--data-dir", str(tmp_path), "--kafka-port", "0", timeout=30)
    assert_one_error_line(r, "bad configuration", "kafka_port")


def test_up_without_the_broker_binary_says_so(tmp_path: Path) -> None:
    kafka_port, http_port = free_port(), free_port()
    missing = tmp_path / "no" / "noida-db"
    r = clocktower("up", "--data-dir", str(tmp_path / "ct"), "--kafka-port", str(kafka_port),
                   "--http-port", str(http_port), env=_env(CLOCKTOWER_NOIDA_BIN=str(missing)), timeout=30)
    assert_one_error_line(r, "CLOCKTOWER_NOIDA_BIN", str(missing))
    assert lock_is_free(tmp_path / "ct") and not listening(kafka_port) and not listening(http_port)


def testnoida_binary_not_installed_anywhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stack_module.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(stack_module.sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(UserError, match="noida-db .* is not installed"):
        stack_module.noida_binary()


def testnoida_binary_is_the_packaged_binary_not_its_wrapper_script() -> None:
    # The console script stops the broker with SIGKILL 0.25 s after a SIGINT, losing its newest records.
    found = Path(stack_module.noida_binary())
    assert found.read_bytes()[:4] == b"\x7fELF", f"{found} is not the broker binary itself"
