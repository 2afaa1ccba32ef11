"""`clocktower demo`, the README's main job, run as a user runs it (a short one): exact counts, detected
faults, and clock-corrected one-way latency in `flow_latency` checked against the simulator's ground truth."""

from __future__ import annotations

import json
from pathlib import Path

from clocktower.ports import free_port
from tests.test_cli import _env, clocktower


def test_demo_summary_has_no_errors_and_corrected_latency(tmp_path: Path) -> None:
    r = clocktower("demo", "--duration", "12", "--nodes", "3", "--json", "--data-dir", str(tmp_path / "ct"),
                   "--kafka-port", str(free_port()), "--http-port", str(free_port()), env=_env(), timeout=240)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    summary = json.loads(r.stdout)
    assert summary["errors"] == []
    clock = summary["clock_sync"]
    assert clock["nodes_estimated"] == 3 and clock["reference"] == ["node-0"]
    # most segments are joined after the first estimate (about 1 s of probes in)
    assert clock["flow_latency_corrected"] > 0.5 * clock["flow_latency_rows"] > 0
    truth = clock["vs_ground_truth"]
    assert truth["offset_error_ns"]["p99"] < 200 and truth["offset_within_bound"] >= 0.99
    assert truth["latency_error_ns"]["p99"] < 300 and truth["latency_within_bound"] >= 0.99
    assert 4_000 < clock["corrected_latency_ns"]["p50"] < 1_000_000
