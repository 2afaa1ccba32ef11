"""Every benchmark's `--quick` mode runs and prints one JSON object: a smoke test, so that none rots.

The figures are not checked here (timings belong to the benchmarks, on a quiet machine); only that each one runs
to the end and reports its keys. `clock_sync_scenarios.py` (the clock benchmarks' trace generator) and
`py_spy_profile.py` (their profiler) are not benchmarks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).parent.parent / "benchmarks"
HELPERS = {"clock_sync_scenarios.py", "py_spy_profile.py"}
NEEDS_ROOT = {"agent_overhead.py": "eBPF programs", "failover.py": "network namespaces and veth pairs"}
KEYS = {   # a key each must report: the figure it exists for
    "agent_overhead.py": "agent_cpu_pct_of_one_core",
    "clock_solve.py": "clock_solve_ms_64_nodes",
    "clock_sync.py": "scenarios",
    "detection.py": "kinds",
    "endpoint_concurrency.py": "ratio",
    "endpoint_insert_parse.py": "insert_2MiB_cpu_s",
    "failover.py": "local_failover_ms_p99",
    "forged_commands.py": "forged_us_per_command",
    "idle_cpu.py": "idle_cpu_pct_total",
    "pipeline_throughput.py": "end_to_end_vs_raw",
    "storage.py": "codecs_vs_lz4",
    "streams_scaling.py": "workers_2_over_1",
}


def test_every_benchmark_is_listed() -> None:
    found = {p.name for p in BENCHMARKS.glob("*.py")} - HELPERS
    assert found == set(KEYS), "a new benchmark needs its --quick smoke run here"


@pytest.mark.parametrize("name", sorted(KEYS))
def test_quick_mode_runs_and_prints_one_json_object(name: str) -> None:
    if name in NEEDS_ROOT and os.geteuid() != 0:
        pytest.skip(f"{name} needs root for its {NEEDS_ROOT[name]}")
    r = subprocess.run([sys.executable, str(BENCHMARKS / name), "--quick"], capture_output=True, text=True,
                       timeout=420, cwd=BENCHMARKS.parent)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    figures = json.loads(r.stdout)
    assert isinstance(figures, dict) and KEYS[name] in figures, figures
