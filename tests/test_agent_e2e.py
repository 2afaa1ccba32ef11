"""`clocktower agent` publishing through the spooling publisher into the real pipeline: the broker, the
sink and ClickHouse. What the agent reports as delivered is exactly what lands in the tables."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from clocktower.summary import table_rows
from tests.test_cli import _env


def test_agent_events_land_in_clickhouse(pipeline, tmp_path: Path) -> None:
    s, client = pipeline.settings, pipeline.client
    proc = subprocess.run(
        [sys.executable, "-m", "clocktower", "agent", "--node", "agent-e2e", "--kafka", s.bootstrap, "--sources",
         "links,gpu,ib", "--duration", "2", "--json", "--spool-dir", str(tmp_path / "spool"),
         "--compression", "zstd"],
        capture_output=True, text=True, env=_env(), timeout=90)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["sources"]["links"]["enabled"] is True
    links = report["delivered"]["link_state"]
    assert links >= 1 and report["publisher"]["dropped_events"] == 0
    deadline = time.monotonic() + 60
    stored = 0
    while time.monotonic() < deadline:
        stored = client.query("SELECT count() FROM link_states WHERE node = 'agent-e2e'").result_rows[0][0]
        if stored >= links:
            break
        pipeline.stack.supervise()
        time.sleep(0.3)
    assert stored == links
    assert table_rows(client)["deadletter"] == 0
