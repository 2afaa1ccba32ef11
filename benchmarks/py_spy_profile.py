"""Sampling profiles of the benchmarks' child processes with py-spy (on PyPI), and their top costs.

`--profile DIR` in streams_scaling.py and pipeline_throughput.py attaches py-spy to a stream worker or to the
sink while it is timed, writes py-spy's raw (collapsed-stack) output to DIR, and puts the top costs in the
benchmark's JSON: per function, the share of samples in which it was running itself (`self`) and the share in
which it was on the stack (`total`). Not a benchmark: a helper (listed in tests/test_benchmarks_quick.py).
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

_FRAME_LINE = re.compile(r" \((?P<file>[^():]*):\d+\)$")


class PySpy:
    """py-spy recording one process, from start() until stop()."""

    def __init__(self, pid: int, out: Path, rate: int = 200) -> None:
        exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        if not Path(exe).exists():
            raise SystemExit("--profile needs py-spy: pip install py-spy")
        out.parent.mkdir(parents=True, exist_ok=True)
        self.out = out
        self._cmd = [exe, "record", "--pid", str(pid), "--format", "raw", "--rate", str(rate), "--nonblocking",
                     "--output", str(out)]
        self._proc: subprocess.Popen | None = None

    def start(self) -> None:
        self._proc = subprocess.Popen(self._cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def stop(self) -> None:
        """Ends the recording (SIGINT makes py-spy write its output) and waits for the file."""
        if self._proc is None:
            return
        self._proc.send_signal(signal.SIGINT)
        try:
            _, err = self._proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            raise RuntimeError("py-spy did not stop within 30 s") from None
        if not self.out.exists():
            raise RuntimeError(f"py-spy wrote no profile: {err.decode(errors='replace')[-500:]}")


def _function(frame: str) -> str:
    """'name (path/to/file.py:12)' -> 'name (file.py)': one entry per function, whatever its line."""
    m = _FRAME_LINE.search(frame)
    if m is None:
        return frame
    return f"{frame[:m.start()]} ({Path(m.group('file')).name})"


def top_costs(raw: Path, n: int = 10) -> dict[str, object]:
    """The `n` functions with most self samples and the `n` with most samples on the stack, as shares of all."""
    own: Counter[str] = Counter()
    on_stack: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        k = int(count)
        frames = [_function(f) for f in stack.split(";")]
        total += k
        own[frames[-1]] += k
        for f in set(frames):
            on_stack[f] += k
    share = lambda c: [[f, round(v / total, 3)] for f, v in c.most_common(n)]  # noqa: E731
    return {"samples": total, "self": share(own) if total else [], "total": share(on_stack) if total else []}
