"""A supervised child process with its log file under the data dir."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path


class ChildProcess:
    """Starts `argv` in its own session, logs to `log_path`, stops it with SIGTERM then SIGKILL, can restart it."""

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
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        try:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
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
        if not self.alive():
            return
        assert self.proc is not None
        self._signal_group(self.stop_signal)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        if self.alive():
            assert self.proc is not None
            self._signal_group(signal.SIGKILL)
            self.proc.wait(10)

    def restart_if_dead(self) -> bool:
        """Restart a crashed child (the sink and streams resume from committed state)."""
        if self.proc is not None and not self.alive():
            self.restarts += 1
            time.sleep(min(5.0, 0.5 * self.restarts))
            self.start()
            return True
        return False
