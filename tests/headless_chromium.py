"""Debian's chromium, headless, for the tests of `clocktower report`: the page after its scripts ran, a screenshot.

The report writes its own verdict into `#report-status` (clocktower/report.py): how many charts drew, how many
traces each, and how many errors its scripts met. Chromium's own log (--enable-logging=stderr) is read as well:
a console error or an uncaught exception there counts, whatever the page says.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--virtual-time-budget=15000",
         "--enable-logging=stderr", "--v=0"]
CONSOLE_ERROR = re.compile(r":(?:ERROR|FATAL):CONSOLE|Uncaught ", re.IGNORECASE)


@dataclass(frozen=True)
class Rendered:
    charts: int
    traces: list[int]
    errors: int
    status: str
    console_errors: list[str]


def chromium() -> str:
    path = shutil.which("chromium")
    if path is None:
        pytest.skip("chromium is not installed (`make setup-chromium` installs Debian's package, as root)")
    return path


def _run(args: list[str]) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="ct-chromium-") as profile:   # no profile left behind, none shared
        return subprocess.run([chromium(), *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True,
                              text=True, timeout=120)


def render(page: Path) -> Rendered:
    done = _run(["--dump-dom", page.resolve().as_uri()])
    assert done.returncode == 0, done.stderr[-3000:]
    m = re.search(r'<p id="report-status"([^>]*)>([^<]*)</p>', done.stdout)
    assert m, "no #report-status in the page chromium rendered"
    attrs = dict(re.findall(r'data-(\w+)="([^"]*)"', m[1]))
    return Rendered(int(attrs.get("charts") or 0), [int(n) for n in attrs.get("traces", "").split(",") if n],
                    int(attrs.get("errors") or 0), m[2], [ln for ln in done.stderr.splitlines()
                                                           if CONSOLE_ERROR.search(ln)])


def screenshot(page: Path, out: Path, width: int = 1400, height: int = 2200) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    done = _run([f"--window-size={width},{height}", f"--screenshot={out.resolve()}", page.resolve().as_uri()])
    assert done.returncode == 0 and out.stat().st_size > 10_000, done.stderr[-3000:]
    return out
