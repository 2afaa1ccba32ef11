"""`clocktower report`: one self-contained HTML file whose charts draw in a real browser with no console error.

On the session's simulated fleet run (tests/simulated_fleet.py): the report is written, rendered in headless
chromium, and its screenshot kept as a test artifact (.artifacts/report.png, or $CLOCKTOWER_TEST_ARTIFACTS).
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from html.parser import HTMLParser
from pathlib import Path

import pytest

from clocktower.report import CHARTS, render_report
from clocktower.report_query import read_report
from clocktower.runtime.errors import UserError
from tests.headless_chromium import render, screenshot

ARTIFACTS = Path(os.environ.get("CLOCKTOWER_TEST_ARTIFACTS", Path(__file__).resolve().parents[1] / ".artifacts"))


@pytest.fixture(scope="module")
def report(simulated_fleet, tmp_path_factory) -> tuple[Path, object]:
    data = read_report(simulated_fleet.admin, "job-demo", None)
    page = tmp_path_factory.mktemp("report") / "report.html"
    page.write_text(render_report(data, [["iteration 3 took 2.0x", "rank 1 waited"]], datetime.now(UTC)))
    return page, data


def test_the_report_reads_every_chart_s_data_from_the_run(report) -> None:
    _, data = report
    assert len(data.iterations) > 50 and any(r[4] >= 1.2 for r in data.iterations), "stragglers to mark"
    assert {r[1] for r in data.latency} >= {"node-0.demo → node-1.demo"} and len({r[1] for r in data.latency}) >= 4
    assert len({r[1] for r in data.temperature}) == 4 and any(r[3] for r in data.temperature), "throttling"
    assert {r[2] for r in data.incidents} >= {"link_flap", "gpu_xid"}    # each link_down went on to flap
    assert "failover" in {r[2] for r in data.commands} and {r[4] for r in data.commands} == {"applied"}


def test_every_chart_draws_in_chromium_with_no_console_error_and_a_screenshot_is_kept(report) -> None:
    page, _ = report
    seen = render(page)
    assert (seen.charts, seen.errors, seen.console_errors) == (CHARTS, 0, []), seen
    assert len(seen.traces) == CHARTS and all(n >= 1 for n in seen.traces), seen
    assert seen.status == f"{CHARTS} of {CHARTS} charts drawn; no errors"
    shot = screenshot(page, ARTIFACTS / "report.png")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_script_error_in_the_page_is_caught(report, tmp_path: Path) -> None:
    """The check can fail: the same page with a script that throws reports the error, and chromium logs it."""
    page, _ = report
    broken = tmp_path / "broken.html"
    broken.write_text(page.read_text().replace("</body>", "<script>noSuchFunction();</script></body>"))
    seen = render(broken)
    assert seen.errors == 1 and "noSuchFunction" in seen.status, seen
    assert any("noSuchFunction" in line for line in seen.console_errors), seen   # and chromium's log says so


def test_the_report_file_opens_offline(report) -> None:
    """Nothing fetched: no element of the page names a source, a stylesheet or a link to load."""
    class Loads(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.found: list[tuple] = []

        def handle_starttag(self, tag: str, attrs: list) -> None:
            self.found += [(tag, k, v) for k, v in attrs if k in ("src", "href") and tag != "a"]

    text = report[0].read_text()
    parser = Loads()
    parser.feed(text)
    assert parser.found == [] and 1_000_000 < len(text) < 8_000_000, parser.found


def test_a_job_with_no_judged_iteration_is_refused_plainly(simulated_fleet) -> None:
    with pytest.raises(UserError, match="no iteration of nobody has been judged"):
        read_report(simulated_fleet.admin, "nobody", None)
