"""`clocktower demo`, the README's main job, run as a user runs it (a short one): exact counts, detected
faults, clock-corrected one-way latency in `flow_latency` checked against the simulator's ground truth, and every
control command acked by the simulated nodes' actuators."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from rich.console import Console
from rich.live import Live
from rich.text import Text

from clocktower import cli
from clocktower.config import Settings
from clocktower.demo_actuators import ALL_NODES_UP_TO, SPARE_NODE, actuated_nodes
from clocktower.ports import free_port
from clocktower.report import CHARTS
from clocktower.summary import control_errors
from tests.headless_chromium import render
from tests.test_cli import _env, clocktower


def test_demo_summary_has_no_errors_and_corrected_latency(tmp_path: Path) -> None:
    r = clocktower("demo", "--duration", "12", "--nodes", "3", "--json", "--data-dir", str(tmp_path / "ct"),
                   "--kafka-port", str(free_port()), "--http-port", str(free_port()), env=_env(), timeout=240)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    summary = json.loads(r.stdout)
    assert summary["errors"] == []          # nothing dead-lettered: every simulated node signed what it sent
    key_file = tmp_path / "ct" / "producer.key"   # made by the demo; the streams act only on signed records
    assert key_file.stat().st_mode & 0o777 == 0o600
    clock = summary["clock_sync"]
    assert clock["nodes_estimated"] == 3 and clock["reference"] == ["node-0.demo"]
    # Estimates were applied, and the corrected rows are right (below). How many rows get one is a figure of load,
    # not a pass/fail: beside `yes` the first estimates of the other nodes came 1-5 s in, and solves left nodes out
    # while their clock edges ran late, so the share corrected was 20-82 % (stop 25, 14 runs); issue 20 item 3.
    after = clock["after_first_estimates"]
    assert 0 < clock["flow_latency_corrected"] <= clock["flow_latency_rows"]
    assert 0 < after["corrected"] <= after["rows"] <= clock["flow_latency_rows"]
    truth = clock["vs_ground_truth"]
    assert truth["offset_error_ns"]["p99"] < 200 and truth["offset_within_bound"] >= 0.99
    assert truth["latency_error_ns"]["p99"] < 300 and truth["latency_within_bound"] >= 0.99
    assert 4_000 < clock["corrected_latency_ns"]["p50"] < 1_000_000
    # The loop closes: the simulated nodes' (and the spare's) real actuators acked every command, all applied, and
    # the link flap (failover) and the lost GPU (drain + spare) each have a time from fault to ack.
    commands = summary["control_commands"]
    assert {"failover", "drain", "spare"} <= set(commands), commands
    assert summary["commands_unacked"] == []
    assert summary["control_acks"] == {"applied": sum(commands.values())}, (summary["control_acks"], commands)
    to_ack = {f["kind"]: f["fault_to_ack_ms"] for f in summary["fault_to_ack"]}
    assert {"link_flap", "gpu_xid"} <= set(to_ack), summary["fault_to_ack"]
    assert all(0 < ms < 120_000 for ms in to_ack.values()), to_ack
    # `clocktower explain` on the data the demo left: the worst moments of its job, each with its rank and cause
    r = clocktower("explain", "--json", "--data-dir", str(tmp_path / "ct"), env=_env(), timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    explained = json.loads(r.stdout)
    assert explained["job"] == "job-demo" and 1 <= len(explained["iterations"]) <= 3, explained
    worst = summary["worst_iterations"][0]
    first = explained["iterations"][0]
    assert first["iteration"]["slowest_rank"] == worst["slowest_rank"] or worst["blame"] == "none", (first, worst)
    for e in explained["iterations"]:
        it, lines = e["iteration"], e["narrative"]
        assert lines[0].startswith(f"iteration {it['iteration']} of job-demo at ") and "x the job's typical" in lines[0]
        assert f"rank {it['slowest_rank']} (on {it['node']}" in lines[1], lines
        assert lines[2].startswith(f"blame: {it['blame']}"), lines
        assert it["slowest_rank"] in {r["rank"] for r in e["ranks"]}, e   # its ranks' breakdowns, read back
    # `clocktower report` on the same data: one HTML file; where chromium is installed, every chart draws in it
    page = tmp_path / "report.html"
    r = clocktower("report", "--out", str(page), "--data-dir", str(tmp_path / "ct"), env=_env(), timeout=120)
    assert r.returncode == 0 and r.stdout.startswith(f"wrote {page}"), r.stderr[-3000:]
    if shutil.which("chromium"):
        seen = render(page)
        assert (seen.charts, seen.errors, seen.console_errors) == (CHARTS, 0, []), seen


SUMMARY = {
    "events_produced": {"gpu_health": 10, "link_state": 4}, "rows": {"gpu_health": 10, "link_states": 4},
    "faults_injected": [{"fault_id": "f1", "kind": "link_flap", "target": "node-1:eth0", "node": "node-1",
                         "detected": True},
                        {"fault_id": "f2", "kind": "gpu_xid", "target": "node-3:gpu5", "node": "node-3",
                         "detected": False}],
    "incidents_detected": {"link_flap": 1}, "control_commands": {"failover": 1},
    "iterations_blamed": {"host": 1, "none": 9},
    "worst_iterations": [{"job": "job-demo", "iteration": 120, "slowdown": 1.5, "slowest_rank": 9, "node": "node-1",
                          "blame": "host", "evidence": '{"incident":"straggler:x"}'}],
    "control_acks": {"applied": 1}, "watchdog_actions": 0, "commands_unacked": [],
    "fault_to_ack": [{"fault_id": "f1", "kind": "link_flap", "node": "node-1", "fault_to_ack_ms": 2345.6}],
    "clock_sync": {"nodes_estimated": 3, "reference": ["node-0"], "flow_latency_rows": 200,
                   "flow_latency_corrected": 150, "vs_ground_truth": {"offset_error_ns": {"p99": 12.5},
                                                                      "latency_error_ns": {"p99": 30.0}}},
    "deadletter": 0, "errors": [],
}


def _demo(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *flags: str,
          workers: int = 1) -> str:
    import clocktower.demo

    def run_demo(settings: Settings, duration: float, nodes: int, console: Console, seed: int) -> dict:
        assert settings.streams_workers == workers
        with Live(Text("link_states │ 486"), console=console, transient=False):  # as the real one shows progress
            pass
        return SUMMARY

    monkeypatch.setattr(clocktower.demo, "run_demo", run_demo)
    monkeypatch.setenv("COLUMNS", "100")
    assert cli.main(["demo", *flags]) == 0
    return capsys.readouterr().out


def test_demo_prints_json_only_when_asked(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    out = _demo(monkeypatch, capsys)
    assert "{" not in out and "events_produced" not in out, out  # no JSON glued on
    assert "link_states │ 486" in out.splitlines(), f"the summary starts on the progress table's last line:\n{out}"
    for shown in ("link_flap", "node-1:eth0", "yes", "gpu_xid", "no", "failover 1", "acks: applied 1",
                  "fault to ack: 1 faults, 2,346 to 2,346 ms", "150 of 200", "no errors", "slowest iterations",
                  "1.50x", "host", "straggler:x"):
        assert shown in out, f"{shown!r} not in\n{out}"
    assert json.loads(_demo(monkeypatch, capsys, "--json")) == SUMMARY
    # issue 19: the demo runs as many stream workers as `up` can (the Stack starts settings.streams_workers)
    assert json.loads(_demo(monkeypatch, capsys, "--json", "--streams-workers", "2", workers=2)) == SUMMARY


def test_an_unacked_command_is_an_error() -> None:
    assert control_errors({"commands_unacked": []}) == []
    assert control_errors({"commands_unacked": ["c1", "c2"]}) == ["2 control commands got no ack: ['c1', 'c2']"]
    many = control_errors({"commands_unacked": [f"c{i}" for i in range(12)]})[0]
    assert many.startswith("12 control commands got no ack: ['c0',") and "c10" not in many and many.endswith(" ...")


def test_an_action_no_node_applied_is_an_error() -> None:
    assert control_errors({"commands_unacked": [], "not_applied": []}) == []
    (err,) = control_errors({"commands_unacked": [], "not_applied": [
        {"action": "drain", "node": "node-1", "acks": ["failed", "refused"]}]})
    assert err.startswith("1 ordered actions no node applied: [{'action': 'drain', 'node': 'node-1'")


def test_every_node_runs_an_actuator_in_a_small_fleet_and_the_faulty_ones_in_a_big_one() -> None:
    small = [f"node-{i}.demo" for i in range(4)]
    assert actuated_nodes(small, {"node-1.demo"}) == [*small, SPARE_NODE]
    big = [f"node-{i}.demo" for i in range(ALL_NODES_UP_TO + 1)]
    assert actuated_nodes(big, {"node-3.demo", "node-1.demo", "elsewhere"}) == ["node-1.demo", "node-3.demo",
                                                                                 SPARE_NODE]
