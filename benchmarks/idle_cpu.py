"""CPU used by an idle `clocktower up` (broker, ClickHouse endpoint, sink, streams; no traffic). Prints JSON.

The embedded broker answers every fetch at once, whatever `fetch.wait.max.ms` asks, so a consumer that
does not back off on empty fetches spins; this measures what the idle stack costs. Each service's figure
is the utime+stime (from /proc/<pid>/stat) of every process in its process group (the child leads its
own session), over `--seconds` once the workers are up (the sink's and the streams' consumer groups are
stable with partitions assigned) and `--settle` more seconds have passed. In percent of one core. Linux only.

Usage: python benchmarks/idle_cpu.py [--seconds 30] [--settle 10]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from confluent_kafka import ConsumerGroupState, KafkaException  # noqa: E402
from confluent_kafka.admin import AdminClient  # noqa: E402

from clocktower.config import Settings  # noqa: E402
from clocktower.ports import free_port  # noqa: E402
from clocktower.stack import Stack  # noqa: E402

GOAL_PCT = 5.0
TICKS = os.sysconf("SC_CLK_TCK")
# The consumer group of each worker: it is up once its group is stable with partitions assigned.
GROUPS = {"sink": "clocktower-sink", "streams": "clocktower-streams"}


def group_ticks(pgid: int) -> int:
    """utime+stime, in clock ticks, of every live process in process group `pgid` (all its threads)."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue                        # gone meanwhile
        fields = stat[stat.rindex(")") + 2:].split()   # after "pid (comm) "; comm may hold spaces
        if int(fields[2]) == pgid:          # field 5 of stat: pgrp
            total += int(fields[11]) + int(fields[12])   # fields 14, 15: utime, stime
    return total


def wait_up(stack: Stack, bootstrap: str, timeout: float) -> None:
    """Until every worker's consumer group is stable with partitions assigned; raises if one died or `timeout`."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + timeout
    waiting = {n: g for n, g in GROUPS.items() if n in stack.children}
    while waiting and time.monotonic() < deadline:
        for name in waiting:
            if not stack.children[name].alive():
                raise RuntimeError(f"{name} exited: {stack.children[name].log_tail(3)}")
        for group, future in admin.describe_consumer_groups(list(waiting.values()), request_timeout=5).items():
            try:
                desc = future.result(10)
            except KafkaException:
                continue
            if desc.state == ConsumerGroupState.STABLE and any(m.assignment and m.assignment.topic_partitions
                                                               for m in desc.members):
                waiting = {n: g for n, g in waiting.items() if g != group}
        time.sleep(0.5)
    if waiting:
        raise RuntimeError(f"not up within {timeout:.0f} s: {sorted(waiting)}")


def measure(stack: Stack, seconds: float) -> dict[str, float]:
    """Percent of one core used by each service over `seconds`."""
    pgids = {name: child.pid for name, child in stack.children.items() if child.pid is not None}
    before = {name: group_ticks(pgid) for name, pgid in pgids.items()}
    start = time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - start
    return {name: round(100.0 * (group_ticks(pgid) - before[name]) / TICKS / elapsed, 2)
            for name, pgid in pgids.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=30.0, help="how long to measure (default 30)")
    ap.add_argument("--settle", type=float, default=10.0, help="wait after the workers are up (default 10)")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 3 s measured after 1 s")
    args = ap.parse_args()
    if args.quick:
        args.seconds, args.settle = 3.0, 1.0
    tmp = Path(tempfile.mkdtemp(prefix="ct-idle-"))
    settings = Settings(data_dir=tmp, kafka_port=free_port(), http_port=free_port(), kafka_bootstrap=None,
                        clickhouse_url=None)
    stack = Stack(settings)
    try:
        stack.start()
        wait_up(stack, settings.bootstrap, 120)
        time.sleep(args.settle)
        by_process = measure(stack, args.seconds)
        stack.supervise()                     # raises if a service died meanwhile
        restarted = {n: c.restarts for n, c in stack.children.items() if c.restarts}
    finally:
        stack.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    total = round(sum(by_process.values()), 2)
    print(json.dumps({
        "benchmark": "idle_cpu",
        "seconds": args.seconds,
        "idle_cpu_pct_total": total,
        "idle_cpu_pct_by_process": by_process,
        "restarts": restarted,
        "goal_pct": GOAL_PCT,
        "meets_goal": total < GOAL_PCT,
    }, indent=2))


if __name__ == "__main__":
    main()
