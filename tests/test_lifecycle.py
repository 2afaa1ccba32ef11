"""No orphans: children die with their parent (kill -9 included), stop together, and the data dir is
always released; `up` and `demo` stop cleanly on SIGTERM and SIGHUP as on Ctrl-C."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from clocktower.child_process import ChildProcess
from clocktower.config import Settings
from clocktower.ports import free_port
from clocktower.stack import Stack
from tests.test_cli import Up, _env, _proc_stat, alive, descendants, listening, lock_is_free, wait_for

REPO = Path(__file__).resolve().parents[1]


def _gone(procs: dict[int, str], timeout: float) -> list[int]:
    """Wait until none of `procs` runs; return those still running after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(alive(p, st) for p, st in procs.items()):
            return []
        time.sleep(0.1)
    return [p for p, st in procs.items() if alive(p, st)]


def _kill_all(procs: dict[int, str]) -> None:
    for pid, started in procs.items():
        if alive(pid, started):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


# --- ChildProcess and Stack.stop, with stand-in children --------------------------------------------------------

PARENT = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from clocktower.child_process import ChildProcess
    child = ChildProcess("sleeper", ["sleep", "60"], Path(sys.argv[1]))
    child.start()
    print(child.pid, flush=True)
    time.sleep(60)
""")


def test_a_child_dies_with_its_parent_even_on_kill_9(tmp_path: Path) -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(tmp_path / "sleeper.log")], cwd=REPO,
                              stdout=subprocess.PIPE, text=True)
    child: dict[int, str] = {}
    try:
        line = parent.stdout.readline()  # type: ignore[union-attr]
        pid = int(line)
        st = _proc_stat(pid)
        assert st is not None
        child = {pid: st[19]}
        parent.kill()                                   # SIGKILL: no handler, no finally runs
        parent.wait(10)
        assert not _gone(child, 5), "the child outlived its parent (no parent-death signal)"
    finally:
        parent.kill()
        _kill_all(child)


SLOW_TO_STOP = "trap 'sleep 1.5; exit 0' TERM; touch \"$0\"; while :; do sleep 0.05; done"


def _slow_children(stack: Stack, tmp_path: Path) -> dict[int, str]:
    """Stand-ins for the four services; each takes 1.5 s to exit after SIGTERM."""
    for name in ("broker", "clickhouse", "sink", "streams"):
        ready = tmp_path / f"{name}.ready"
        child = ChildProcess(name, ["bash", "-c", SLOW_TO_STOP, str(ready)], tmp_path / f"{name}.log")
        child.start()
        stack.children[name] = child
    for name in stack.children:
        wait_for(f"{name} to trap SIGTERM", (tmp_path / f"{name}.ready").exists, 10)
    return {c.pid: _proc_stat(c.pid)[19] for c in stack.children.values()}  # type: ignore[index,misc]


def _stack(tmp_path: Path) -> Stack:
    settings = Settings(data_dir=tmp_path / "ct", kafka_port=free_port(), http_port=free_port(),
                        kafka_bootstrap=None, clickhouse_url=None)
    stack = Stack(settings)
    stack.lock.acquire()
    (stack.data_dir / "owner.json").write_text(json.dumps({"pid": os.getpid()}))
    return stack


def test_stack_stops_its_children_together_and_releases_the_data_dir(tmp_path: Path) -> None:
    stack = _stack(tmp_path)
    procs = _slow_children(stack, tmp_path)
    try:
        t0 = time.monotonic()
        stack.stop()
        took = time.monotonic() - t0
        assert not _gone(procs, 1)
        assert took < 4.5, f"stop took {took:.1f} s: one after the other (4 x 1.5 s), not together"
        assert not (stack.data_dir / "owner.json").exists() and lock_is_free(stack.data_dir)
    finally:
        _kill_all(procs)


def test_stack_releases_the_data_dir_even_when_a_child_stop_fails(tmp_path: Path) -> None:
    stack = _stack(tmp_path)
    procs = _slow_children(stack, tmp_path)
    broken = stack.children["sink"].proc
    assert broken is not None

    def wait_fails(timeout: float | None = None) -> int:
        raise RuntimeError("cannot wait")

    broken.wait = wait_fails  # type: ignore[method-assign]
    try:
        stack.stop()
        assert not _gone(procs, 2), "every child is stopped, the broken one killed"
        assert not (stack.data_dir / "owner.json").exists() and lock_is_free(stack.data_dir)
    finally:
        _kill_all(procs)


# --- the real commands ----------------------------------------------------------------------------------------


def _ports_free(up: Up) -> bool:
    return not listening(up.kafka_port) and not listening(up.http_port)


def test_sighup_stops_up_and_every_child(tmp_path: Path) -> None:
    up = Up(tmp_path / "ct", free_port(), free_port())
    up.start()
    assert up.proc is not None
    try:
        up.wait_ready()
        up.proc.send_signal(signal.SIGHUP)             # the terminal closed
        up.proc.wait(40)
        assert up.proc.returncode == 0, up.output()
        assert not _gone(up.children, 5), "children outlived `up`"
        assert _ports_free(up)
        assert not (up.data_dir / "owner.json").exists()
        assert lock_is_free(up.data_dir)
        assert "Traceback" not in up.output()
    finally:
        up.proc.kill()
        _kill_all({**up.children, **descendants(up.proc.pid)})


def test_kill_9_of_up_takes_every_child_down(tmp_path: Path) -> None:
    up = Up(tmp_path / "ct", free_port(), free_port())
    up.start()
    assert up.proc is not None
    try:
        up.wait_ready()
        up.proc.kill()
        up.proc.wait(10)
        assert not _gone(up.children, 30), "children outlived `up` (no parent-death signal)"
        wait_for("the ports to be free", lambda: _ports_free(up), 5)
        assert lock_is_free(up.data_dir)
    finally:
        up.proc.kill()
        _kill_all(up.children)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_demo_stops_cleanly_on(sig: signal.Signals, tmp_path: Path) -> None:
    data_dir, kafka_port, http_port = tmp_path / "ct", free_port(), free_port()
    with open(tmp_path / "demo.out", "wb") as out, open(tmp_path / "demo.err", "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "clocktower", "demo", "--duration", "120", "--nodes", "2",
                                 "--json", "--data-dir", str(data_dir), "--kafka-port", str(kafka_port),
                                 "--http-port", str(http_port)], stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                env=_env(), cwd=REPO)

    def output() -> str:
        return (tmp_path / "demo.out").read_text(errors="replace") + (tmp_path / "demo.err").read_text(errors="replace")

    children: dict[int, str] = {}
    try:
        wait_for("the demo's four services", lambda: len(descendants(proc.pid)) >= 4, 90,
                 lambda: proc.poll() is None, output)
        wait_for("owner.json", (data_dir / "owner.json").exists, 90, lambda: proc.poll() is None, output)
        children = descendants(proc.pid)
        proc.send_signal(sig)
        proc.wait(60)
        assert proc.returncode in (1, 130), output()     # 1: interrupted, with its summary; 130: while starting
        assert "Traceback" not in output()
        assert not _gone(children, 5), "children outlived the demo"
        assert not listening(kafka_port) and not listening(http_port)
        assert not (data_dir / "owner.json").exists() and lock_is_free(data_dir)
    finally:
        proc.kill()
        _kill_all({**children, **descendants(proc.pid)})


NOHUP_CHECK = textwrap.dedent("""
    import signal
    from clocktower.shutdown_signals import stop_on_signals
    stop_on_signals()
    print(signal.getsignal(signal.SIGHUP) is signal.SIG_IGN,
          signal.getsignal(signal.SIGTERM) is signal.default_int_handler)
""")


@pytest.mark.parametrize("ignored", [True, False], ids=["under-nohup", "plain"])
def test_sighup_stops_unless_nohup_asked_to_ignore_it(ignored: bool) -> None:
    def preexec() -> None:
        signal.signal(signal.SIGHUP, signal.SIG_IGN if ignored else signal.SIG_DFL)

    out = subprocess.run([sys.executable, "-c", NOHUP_CHECK], cwd=REPO, capture_output=True, text=True, timeout=30,
                         preexec_fn=preexec)
    assert out.stdout.split() == [str(ignored), "True"], out.stderr


def test_start_worker_refuses_before_start_and_never_runs_a_second_copy(tmp_path: Path) -> None:
    from clocktower.runtime.errors import UserError

    stack = Stack(Settings(data_dir=tmp_path / "d"), with_sink=False, with_streams=False)
    with pytest.raises(UserError, match="not started"):
        stack.start_worker("sink")
    stack.services_up = True                       # as after start(): only the worker rule is under test here

    class Alive:
        def alive(self) -> bool:
            return True

        def pid(self) -> int:
            return 4242

    stack.children["sink"] = Alive()               # type: ignore[assignment]
    with pytest.raises(UserError, match="already running"):
        stack.start_worker("sink")
