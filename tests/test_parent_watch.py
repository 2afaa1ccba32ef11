"""A service whose parent died exits within its grace period even when its own shutdown hangs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from clocktower.runtime.parent_watch import EXIT_CODE

# The grandchild ignores SIGTERM (a hung shutdown) and would sleep for a minute; only the watch can end it.
GRANDCHILD = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "from clocktower.runtime.parent_watch import watch_parent; watch_parent(grace_s=0.5, poll_s=0.05); "
    "print('ready', flush=True); time.sleep(60)"
)
PARENT = (
    "import subprocess, sys; "
    f"p = subprocess.Popen([sys.executable, '-c', {GRANDCHILD!r}], stdout=subprocess.PIPE, text=True); "
    "print(p.pid, flush=True); print(p.stdout.readline().strip(), flush=True); import time; time.sleep(60)"
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:   # a zombie (exited, not yet reaped by init) is gone for this purpose
        return f.read().split(")")[-1].split()[0] != "Z"


def test_a_child_outliving_its_parent_exits_after_the_grace_period() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    grandchild = int(parent.stdout.readline())
    try:
        assert parent.stdout.readline().strip() == "ready"
        time.sleep(1.0)
        assert _alive(grandchild), "the watch must not fire while the parent lives"
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        deadline = time.monotonic() + 10
        while _alive(grandchild) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(grandchild), "the orphan outlived its grace period"
    finally:
        parent.kill()
        if _alive(grandchild):
            os.kill(grandchild, signal.SIGKILL)


def test_the_exit_code_says_it_was_the_watch() -> None:
    code = ("import os, threading, time; from clocktower.runtime import parent_watch as w; "
            "real = [os.getppid()]; os.getppid = lambda: real.pop() if real else -1; "
            "w.watch_parent(grace_s=0.1, poll_s=0.01); time.sleep(10)")
    r = subprocess.run([sys.executable, "-c", code], timeout=30, capture_output=True)
    assert r.returncode == EXIT_CODE
