"""Stream workers: throughput with 1 and 2 workers, recovery after kill -9, and the clock solve. Prints JSON.

1. workers_N_events_per_s: a backlog of simulated telemetry (events generated and published beforehand,
   not timed) is processed by N `python -m clocktower.streams` workers with distinct static member ids;
   from the moment their group is stable until its lag (inputs and repartition topics) is 0.
   cpu_s_per_1m_events_per_worker_N: each worker's user+system CPU time over that span, per 1M events.
2. recovery_s_after_kill: 2 workers and the sink, telemetry of `nodes` nodes of 2 GPUs published in real time
   (what 2 workers, the broker, ClickHouse and the sink keep up with on 2 cores); one worker is killed
   with SIGKILL and restarted 5 s later with its member id; seconds from the kill until the lag of the
   partitions it owned is 0 again. lost_joins_after_kill: flow_samples / 2 - flow_latency rows once drained.
3. clock_solve_ms_1024_nodes: one network-effect solve of a 1,024-node probe graph (benchmarks/clock_solve.py).

This machine has 2 cores shared by the broker, the workers and the benchmark itself: 2 workers cannot be
twice as fast here; the CPU time per event says what each worker costs.

Usage: python benchmarks/streams_scaling.py [--nodes 8] [--seconds 20] [--quick] [--profile DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka.admin import AdminClient

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from clock_solve import clock_solve_ms  # noqa: E402
from py_spy_profile import PySpy, top_costs  # noqa: E402

from clocktower.config import Settings  # noqa: E402
from clocktower.drain import wait_drained  # noqa: E402
from clocktower.ports import free_port  # noqa: E402
from clocktower.producers.kafka_publisher import KafkaPublisher  # noqa: E402
from clocktower.producers.simulator import FleetSimulator, SimConfig, run_simulation  # noqa: E402
from clocktower.runtime.clickhouse_client import http_client  # noqa: E402
from clocktower.stack import Stack  # noqa: E402
from clocktower.streams.registry import APP_ID  # noqa: E402
from clocktower.topic_admin import READERS, consumer_lag  # noqa: E402

NS = 1_000_000_000


def _stack(data_dir: Path, with_sink: bool) -> Stack:
    s = Settings(data_dir=data_dir, kafka_port=free_port(), http_port=free_port(), kafka_bootstrap=None,
                 clickhouse_url=None, flush_interval_s=0.5)
    # the workers read their settings from the environment: a Settings field here would not reach them
    stack = Stack(s, with_streams=False, with_sink=with_sink, extra_env={"CLOCKTOWER_REMEDIATION_MAX_PER_HOUR": "1000"})
    stack.start()
    return stack


def _group(bootstrap: str) -> tuple[str, dict[str, set[tuple[str, int]]]]:
    """The streams group's state and each member's assigned (topic, partition)s, by member id."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    g = admin.describe_consumer_groups([APP_ID])[APP_ID].result(10)
    members = {(m.group_instance_id or m.member_id): {(tp.topic, tp.partition) for tp in m.assignment.topic_partitions}
               for m in g.members}
    return str(g.state), members


def wait_stable(bootstrap: str, n: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state, members = _group(bootstrap)
        if state.endswith("STABLE") and len(members) == n:
            return
        time.sleep(0.2)
    raise RuntimeError(f"{n} stream workers never formed a stable group")


def lag(bootstrap: str, only: set[tuple[str, int]] | None = None) -> int:
    rows = consumer_lag(bootstrap, {APP_ID: READERS[APP_ID]})
    return sum(r["lag"] for r in rows if only is None or (r["topic"], r["partition"]) in only)


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int, peak: bool = False) -> float:
    """A process's resident memory now (or its peak, VmHWM), in MB."""
    field = "VmHWM:" if peak else "VmRSS:"
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def throughput(workers: int, nodes: int, seconds: float, root: Path,
               profile: Path | None = None) -> dict[str, object]:
    stack = _stack(root / f"w{workers}", with_sink=False)
    try:
        sim = FleetSimulator(SimConfig(nodes=nodes, duration_s=seconds, seed=3),   # in the past: nothing is stamped
                             start_ns=time.time_ns() - int(seconds * 1e9))          # beyond the 30 s future skew
        published = run_simulation(sim, KafkaPublisher(stack.s.bootstrap), seconds, realtime=False)
        return process_backlog(stack, sum(published.values()), workers, profile)
    finally:
        stack.stop()


def process_backlog(stack: Stack, events: int, workers: int, profile: Path | None = None) -> dict[str, object]:
    """Start `workers` stream workers on a stack whose topics hold `events` events, and time them from a stable
    group until no lag is left (inputs and repartition topics); the CPU and peak RSS of each worker over it."""
    bootstrap = stack.s.bootstrap
    children = [stack.start_worker("streams", i) for i in range(1, workers + 1)]
    wait_stable(bootstrap, workers)
    spy = None if profile is None else PySpy(stack.children[children[0]].pid, profile / f"worker_{workers}.txt")
    if spy is not None:
        spy.start()
    t0 = time.monotonic()
    cpu0 = [_cpu_s(stack.children[c].pid) for c in children]
    while lag(bootstrap) > 0:
        time.sleep(0.2)
    elapsed = time.monotonic() - t0
    if spy is not None:
        spy.stop()
    cpu = [_cpu_s(stack.children[c].pid) - c0 for c, c0 in zip(children, cpu0, strict=True)]
    out: dict[str, object] = {
        f"workers_{workers}_events_per_s": round(events / elapsed),
        f"cpu_s_per_1m_events_per_worker_{workers}": round(sum(cpu) / workers / events * 1e6, 1),
        f"events_{workers}": events, f"seconds_{workers}": round(elapsed, 2),
        f"rss_mb_peak_per_worker_{workers}": [rss_mb(stack.children[c].pid, peak=True) for c in children]}
    if spy is not None:
        out[f"profile_worker_of_{workers}"] = top_costs(spy.out)
    return out


def kill_recovery(nodes: int, seconds: float, root: Path, restart_after_s: float = 5.0) -> dict[str, float]:
    stack = _stack(root / "kill", with_sink=True)
    try:
        bootstrap = stack.s.bootstrap
        children = [stack.start_worker("streams", i) for i in (1, 2)]
        wait_stable(bootstrap, 2)
        victim = stack.children[children[1]]
        sim = FleetSimulator(SimConfig(nodes=nodes, gpus_per_node=2, gpu_health_hz=2.0, duration_s=seconds, seed=4))
        marks: dict[str, float] = {}
        owned: set[tuple[str, int]] = set()

        def on_tick(s: FleetSimulator) -> None:
            elapsed = (s.now_ns - sim.start_ns) / NS
            if "kill" not in marks and elapsed >= seconds / 3:
                members = _group(bootstrap)[1]
                owned.update(next(tps for mid, tps in members.items() if mid.endswith("-2")))
                os.kill(victim.pid, signal.SIGKILL)
                victim.proc.wait()
                marks["kill"] = time.monotonic()
            if "kill" in marks and "restart" not in marks and time.monotonic() - marks["kill"] >= restart_after_s:
                stack.supervise()
                marks["restart"] = time.monotonic()
            if "restart" in marks and "recovered" not in marks and lag(bootstrap, owned) == 0:
                marks["recovered"] = time.monotonic()

        run_simulation(sim, KafkaPublisher(bootstrap), seconds, realtime=True, on_tick=on_tick)
        while "recovered" not in marks:
            if lag(bootstrap, owned) == 0:
                marks["recovered"] = time.monotonic()
            time.sleep(0.1)
        if not wait_drained(bootstrap, 180, check=stack.supervise):
            raise RuntimeError("the pipeline never drained")
        client = http_client(stack.s.clickhouse, *stack.s.clickhouse_login())
        samples = client.query("SELECT count() FROM flow_samples").result_rows[0][0]
        joined = client.query("SELECT count() FROM flow_latency FINAL").result_rows[0][0]
        return {"recovery_s_after_kill": round(marks["recovered"] - marks["kill"], 2),
                "lost_joins_after_kill": samples // 2 - joined, "flow_samples_kill_run": samples}
    finally:
        stack.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--quick", action="store_true", help="a small run (4 nodes, 6 s; the kill run 8 s, restarting "
                                                          "after 2 s; no clock solve)")
    ap.add_argument("--profile", type=Path, metavar="DIR", help="py-spy the first worker of each throughput run "
                    "into DIR, and print its top costs (benchmarks/py_spy_profile.py)")
    a = ap.parse_args()
    nodes, seconds = (4, 6.0) if a.quick else (a.nodes, a.seconds)
    out: dict[str, object] = {}
    t0 = time.monotonic()

    def done(phase: str) -> None:   # progress on stderr: stdout is the one JSON object
        print(f"streams_scaling: {phase} done at {time.monotonic() - t0:.1f} s", file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="ct-scaling-") as tmp:
        root = Path(tmp)
        out |= throughput(1, nodes, seconds, root, a.profile)
        done("1 worker")
        out |= throughput(2, nodes, seconds, root, a.profile)
        done("2 workers")
        # a load the 2 workers keep up with; quick: a shorter run and restart (a smoke test of the code path)
        out |= (kill_recovery(2, 8.0, root, restart_after_s=2.0) if a.quick
                else kill_recovery(max(2, nodes // 2), max(seconds, 15.0), root))
        done("kill and recovery")
    out["workers_2_over_1"] = round(out["workers_2_events_per_s"] / out["workers_1_events_per_s"], 2)
    if not a.quick:   # the solve's own quick run is benchmarks/clock_solve.py --quick
        out["clock_solve_ms_1024_nodes"] = round(clock_solve_ms(1024), 2)
        done("clock solve")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
