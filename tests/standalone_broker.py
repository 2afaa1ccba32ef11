"""A real embedded broker (noida-db) alone, on a free port: for tests that stop, restart or kill it."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from clocktower.ports import free_port, wait_open
from clocktower.stack import noida_binary


class StandaloneBroker:
    def __init__(self, data_dir: Path) -> None:
        self.port = free_port()
        self.data_dir = data_dir
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = data_dir.parent / "broker.log"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([noida_binary(), "start", "--only", "kafka", "--host", "127.0.0.1",
                                          "--kafka-port", str(self.port), "--data-dir", str(self.data_dir)],
                                         stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        assert wait_open("127.0.0.1", self.port, 15), f"broker did not open its port: {self.log.read_text()[-2000:]}"

    def stop(self) -> None:
        """SIGINT: the broker saves its state, as on a clean shutdown."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def snapshot_id(self) -> tuple[int, int] | None:
        """Changes every time the broker writes its state file (a new inode, by rename)."""
        try:
            st = os.stat(self.data_dir / "kafka.json")
        except FileNotFoundError:
            return None
        return st.st_ino, st.st_mtime_ns


@contextmanager
def running(data_dir: Path) -> Iterator[StandaloneBroker]:
    """A StandaloneBroker started in `data_dir`, stopped at the end (for module fixtures)."""
    broker = StandaloneBroker(data_dir)
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()
