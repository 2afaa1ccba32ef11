"""Failover of a link's traffic to its backup port and back, in the netns failover bed. Prints one JSON object.

Two hosts (network namespaces) joined by a primary and a backup veth pair (tests/failover_bed.py); a TCP
stream from host a to host b sends a counter pattern (4 KiB every 0.5 ms) that b checks byte by byte. Each
host runs what its node agent runs for links: a real LinkSource in its namespace feeding a LinkWatchdog that
fails over through KernelRouting (pyroute2). Then, `--flaps` times:

1. the primary goes down: `--mode hard` (default) sets both ends admin down (no carrier, and the kernel
   deletes both hosts' routes via it); `--mode carrier` sets only b's end admin down (a loses carrier and
   keeps its routes, b's are deleted: a cable pulled at one end);
   local_failover_ms = from just before that netlink call until data bytes arrive on b's backup port
   (rx counter polled every ~0.5 ms, so up to ~0.5 ms late; the stream sends every 0.5 ms);
2. 0.1 s later the primary comes back up; once both ends have carrier, `routing.restore` on a then b;
   restore_ms = from just before the restores until data bytes arrive on b's primary port.

bytes_lost = bytes sent but not received by the end (the receiver also fails on any byte out of order);
connections_survived = streams that ended with every byte in order and no socket error (of `connections`).
`--watchdog-ms` is T_watchdog, the hysteresis before a local failover (the agent's default is 50; 0 here,
so the figure is detection plus the route move; with 50 add 50 ms).

pipeline_failover_ms_* (the pipeline deciding instead of the watchdog) are measured elsewhere: see
`measure_pipeline`'s place in `main`.

Needs root (network namespaces).
Usage: python benchmarks/failover.py [--flaps 20] [--watchdog-ms 0] [--mode hard|carrier]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.failover_bed import BACKUP, HOSTS, PRIMARY, FailoverBed, HostAgent, TcpStream, failover_bed  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.4999)))
    return ordered[rank - 1]


def measure_local(bed: FailoverBed, agents: dict[str, HostAgent], stream: TcpStream, flaps: int,
                  mode: str = "hard") -> dict[str, Any]:
    """Downs of the primary handled by the hosts' own watchdogs, each followed by a restore."""
    down, up = (bed.hard_down, bed.hard_up) if mode == "hard" else (
        lambda: bed.carrier_down("a"), lambda: bed.carrier_up("a"))
    failover_ms: list[float] = []
    restore_ms: list[float] = []
    misses = 0
    for _ in range(flaps):
        down_ns = time.time_ns()
        down()
        on_backup = bed.monitor.flow_start("b", BACKUP, after_ns=down_ns, timeout_s=5.0)
        if on_backup is None:
            misses += 1
        else:
            failover_ms.append((on_backup - down_ns) / 1e6)
        time.sleep(0.1)
        up()
        for host in HOSTS:
            bed.wait_carrier(host, PRIMARY, True)
        restore_ns = time.time_ns()
        for host in HOSTS:
            agents[host].routing.restore(PRIMARY, BACKUP)
        on_primary = bed.monitor.flow_start("b", PRIMARY, after_ns=restore_ns, timeout_s=5.0)
        if on_primary is None:
            misses += 1
        else:
            restore_ms.append((on_primary - restore_ns) / 1e6)
        time.sleep(0.1)                         # the watchdogs see the link up: the next down is a new episode
    failed_acks = [a.detail for agent in agents.values() for a in agent.acks if a.status != "applied"]
    return {
        "local_failover_ms_p50": round(percentile(failover_ms, 50), 2) if failover_ms else None,
        "local_failover_ms_p99": round(percentile(failover_ms, 99), 2) if failover_ms else None,
        "local_failover_ms_max": round(max(failover_ms), 2) if failover_ms else None,
        "restore_ms_p50": round(statistics.median(restore_ms), 2) if restore_ms else None,
        "restore_ms_p99": round(percentile(restore_ms, 99), 2) if restore_ms else None,
        "watchdog_acks": sum(len(agent.acks) for agent in agents.values()),
        "watchdog_failed_acks": failed_acks,
        "moves_not_seen": misses,
        "local_failover_ms_all": [round(v, 1) for v in failover_ms],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--flaps", type=int, default=20)
    parser.add_argument("--watchdog-ms", type=float, default=0.0)
    parser.add_argument("--mode", choices=("hard", "carrier"), default="hard")
    parser.add_argument("--rto-min-ms", type=int, default=None,
                        help="rto_min metric on the service routes (default: none, TCP's 200 ms)")
    args = parser.parse_args()
    out: dict[str, Any] = {"flaps": args.flaps, "mode": args.mode, "watchdog_delay_ms": args.watchdog_ms,
                           "rto_min_ms": args.rto_min_ms}
    with (tempfile.TemporaryDirectory(prefix="ct-failover-") as tmp,
          failover_bed("bfo", skip=False, rto_min_ms=args.rto_min_ms) as bed):
        with bed.agents(Path(tmp), delay_s=args.watchdog_ms / 1e3) as agents, bed.stream() as stream:
            stream.wait_bytes(100_000)
            out.update(measure_local(bed, agents, stream, args.flaps, args.mode))
            # measure_pipeline(bed, stream, args.flaps) -> pipeline_failover_ms_p50/_p99 goes here: the same
            # hard downs with the watchdogs off (delay beyond the test) and the pipeline's commands applied.
        result = stream.result
        assert result is not None
    out.update({
        "bytes_sent": result.sent,
        "bytes_lost": max(0, result.sent - result.received),
        "connections": 1,
        "connections_survived": int(result.ok),
        "stream_errors": result.errors,
        "max_receive_stall_ms": round(result.max_stall_ms, 2),
    })
    print(json.dumps(out))


if __name__ == "__main__":
    main()
