"""A supervised child process with its log file under the data dir, which never outlives its parent.

Each child leads its own session (a Ctrl-C in the terminal reaches `clocktower up`, which then stops the
children in order), so a dying parent cannot take its children down through the terminal. Instead each
child asks the kernel for a parent-death signal (PR_SET_PDEATHSIG): its own stop signal, sent when the
parent dies for any reason, kill -9 included. The kernel sends it when the *thread* that started the
child exits, so start children from the main thread.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from clocktower.data_dir import open_log
from clocktower.runtime.private_file import private_dir

PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_prctl = _libc.prctl                       # bound here, in the parent: the forked child only calls it


def die_with_parent(sig: int) -> Callable[[], None]:
    """A preexec_fn: the child gets `sig` when the parent dies, also if it died before this ran."""
    parent = os.getpid()

    def preexec() -> None:
        if _prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            os._exit(127)                  # without the guarantee, do not run at all
        if os.getppid() != parent:         # the parent died between fork and prctl
            os.kill(os.getpid(), sig)

    return preexec


class ChildProcess:
    """Starts `argv` in its own session, logs to `log_path`, stops it with its stop signal then SIGKILL, can
    restart it; it gets its stop signal when this process dies."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path, env: dict[str, str] | None = None,
                 stop_signal: int = signal.SIGTERM) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self.stop_signal = stop_signal

    def start(self) -> None:
        private_dir(self.log_path.parent)
        log = os.fdopen(open_log(self.log_path), "ab")   # never through a planted symlink
        try:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                         stdin=subprocess.DEVNULL, start_new_session=True,
                                         preexec_fn=die_with_parent(self.stop_signal))
        finally:
            log.close()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def exit_code(self) -> int | None:
        return self.proc.poll() if self.proc else None

    def log_tail(self, lines: int = 5) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def _signal_group(self, sig: int) -> None:
        """Signal the child's whole process group (it leads its own session), as Ctrl-C in a terminal would,
        so a wrapper's own children (a console script around a binary) stop with it."""
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)

    def stop(self, timeout: float = 15.0) -> None:
        stop_all([self], timeout)

    def request_stop(self) -> None:
        """Send the stop signal without waiting (see stop_all)."""
        if self.alive():
            self._signal_group(self.stop_signal)

    def wait(self, timeout: float) -> bool:
        """True once the child exited, False if it still runs after `timeout`."""
        if self.proc is None:
            return True
        try:
            self.proc.wait(max(0.0, timeout))
            return True
        except subprocess.TimeoutExpired:
            return False

    def kill(self) -> None:
        if self.alive():
            assert self.proc is not None
            self._signal_group(signal.SIGKILL)
            self.wait(10)

    def restart_if_dead(self) -> bool:
        """Restart a crashed child (the sink and streams resume from committed state)."""
        if self.proc is not None and not self.alive():
            self.restarts += 1
            time.sleep(min(5.0, 0.5 * self.restarts))
            self.start()
            return True
        return False


def stop_all(children: Iterable[ChildProcess], timeout: float) -> list[str]:
    """Stop `children` together: every stop signal first, then one shared deadline, then SIGKILL for whoever
    is left. Never raises for one child; returns the names that had to be killed."""
    children = list(children)
    for child in children:
        with contextlib.suppress(Exception):
            child.request_stop()
    deadline = time.monotonic() + timeout
    killed = []
    for child in children:
        try:
            exited = child.wait(deadline - time.monotonic())
        except Exception:                  # cannot tell: make sure
            exited = False
        if not exited:
            killed.append(child.name)
            with contextlib.suppress(Exception):
                child.kill()
    return killed
