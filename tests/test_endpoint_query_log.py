"""system.query_log on the embedded engine (sinks/endpoint/engine_config.py, engine.py): it works whatever
TMPDIR is, a data dir chdb would misread is refused, and a data dir from before the view keeps its log."""

from __future__ import annotations

import logging
import os
import tempfile
import time
from pathlib import Path

import chdb
import pytest

from clocktower.sinks.endpoint.engine import ChdbEngine
from clocktower.sinks.endpoint.limits import EndpointLimits

LIMITS = EndpointLimits(write_sessions=2, get_sessions=1, reader_sessions=1, query_log_flush_ms=200)


def _logged(engine: ChdbEngine, marker: str) -> int:
    engine.execute(f"SELECT '{marker}'", guard=f"SELECT '{marker}'".encode())
    sql = f"SELECT count() FROM system.query_log WHERE query LIKE '%{marker}%' AND query NOT LIKE '%query_log%'"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        count = int(engine.execute(sql, guard=sql.encode(), readonly=1).data)
        if count:
            return count
        time.sleep(0.2)
    return 0


def test_query_log_works_when_tmpdir_has_url_characters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """chdb reads the config path after '?' as a URL query: '+' became a space and the log was silently off."""
    odd = tmp_path / "tmp+dir%41&x=1"
    odd.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(odd))
    with caplog.at_level(logging.WARNING), ChdbEngine(tmp_path / "data", LIMITS) as engine:
        assert _logged(engine, "marker-odd-tmpdir") > 0
    assert "query_log" not in caplog.text
    assert os.listdir(odd) == []  # the config's folder is gone


def test_data_dir_with_question_mark_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="contains '\\?'"):
        ChdbEngine(tmp_path / "data?config-file=x", LIMITS)


def test_a_data_dir_from_before_the_view_keeps_its_log(tmp_path: Path) -> None:
    config = tmp_path / "old.xml"
    config.write_text("<clickhouse><query_log><database>system</database><table>query_log</table>"
                      "</query_log></clickhouse>")
    old = chdb.connect(f"{tmp_path / 'data'}?config-file={config}")
    old.query("SELECT 'marker-before-view'")
    old.query("SYSTEM FLUSH LOGS")
    old.close()
    with ChdbEngine(tmp_path / "data", LIMITS) as engine:
        sql = "SELECT engine FROM system.tables WHERE database = 'system' AND name = 'query_log'"
        assert engine.execute(sql, guard=sql.encode()).data == b"View\n"
        assert _logged(engine, "marker-before-view") > 0  # the old rows, through the view
