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

Then (unless `--no-pipeline`) the same hard downs with the pipeline deciding (`measure_pipeline`): the real
broker, stream workers and sink (tests/conftest.py's start_pipeline, in a temporary data dir) and, per host,
the real node agent (`clocktower agent --actuate --sources links`, CLOCKTOWER_AGENT_NETNS = the host's
namespace) instead of the bed's watchdog processes. The agents' watchdogs are off (T_watchdog 60 s, the
setting's maximum, beyond every down here) and the stream workers fail over on the down report itself
(CLOCKTOWER_STREAMS_LINK_WATCHDOG_MS=0), so every move is: the agent's netlink source sees the carrier loss
-> LinkState published (spooling publisher) -> broker -> stream workers (link detector) -> signed `failover`
-> control.commands -> the node's actuator consumer -> verify -> KernelRouting. `--flaps` times:

1. hard down; pipeline_failover_ms = from just before that netlink call until data bytes arrive on b's
   backup port (so it includes TCP's retransmit timer: bytes flow again at the first retransmission after
   the route moved; `--rto-min-ms` shortens it); pipeline_route_moved_ms = until a's route to b is seen on
   the backup (polled every ~1 ms: the pipeline's own part);
2. 0.1 s later the primary comes back; the pipeline restores after T_stable (`--stable-s`, 1 s here, 10 by
   default; CLOCKTOWER_STREAMS_LINK_STABLE_S) of stable carrier: pipeline_restore_after_up_ms = from the up
   until data bytes arrive on b's primary port (T_stable included), and the next down waits for it.

pipeline_down_to_command_ms (down until host a's failover record's timestamp on control.commands: the
agent's 0.1 s event batching, the spooling publisher, the broker, the stream workers' idle fetch backoff of up
to 0.25 s) and pipeline_command_to_ack_ms (that until a's ack: the actuator consumer's idle pacing, up to
0.25 s, verifying and moving) say where the time goes (wall clocks of one machine). TCP then adds its
retransmit timer: a stream whose route moved 0.2-0.6 s after the down resumes at the retransmission of
~0.6 s (200 ms rto_min, doubling), so pipeline_failover_ms sits near 620-650 ms or near 210 ms.

Quarantine is lifted for the run (CLOCKTOWER_STREAMS_LINK_QUARANTINE_FLAPS=10000: more than 8 downs an hour
would otherwise hold the traffic on the backup). pipeline_commands / pipeline_acks_applied count the
commands in ClickHouse and their `applied` acks. The stream runs through both parts: bytes_lost and
connections_survived cover both.

Needs root (network namespaces).
Usage: python benchmarks/failover.py [--flaps 20] [--watchdog-ms 0] [--mode hard|carrier] [--no-pipeline]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
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
    downs: list[int] = []
    misses = 0
    for _ in range(flaps):
        down_ns = time.time_ns()
        downs.append(down_ns)
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
    # host a's watchdog, per flap: down -> the agent saw it -> its failover began, and the fail_over call
    # (the watchdog's ack id ends with the agent's stamp of the netlink event: when its recv returned)
    seen_ms, react_ms, apply_ms = [], [], []
    for ack in agents["a"].acks:
        began = ack.ts_ns - ack.apply_ns
        seen = int(ack.command_id.rsplit(":", 1)[1])
        down = max((d for d in downs if d <= began), default=None)
        if down is not None:
            seen_ms.append(round((seen - down) / 1e6, 1))
            react_ms.append(round((began - seen) / 1e6, 1))
            apply_ms.append(round(ack.apply_ns / 1e6, 1))
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
        "local_down_to_event_ms_all": seen_ms,      # the down call and the kernel's netlink event
        "local_event_to_failover_ms_all": react_ms,  # the agent: parse, watchdog, into fail_over
        "local_apply_ms_all": apply_ms,             # the whole fail_over call (routes first, then a dump and a save)
    }


PIPELINE_ENV = {
    "CLOCKTOWER_STREAMS_LINK_WATCHDOG_MS": "0",          # the stream workers fail over on the down report
    "CLOCKTOWER_STREAMS_IDLE_FETCH_BACKOFF_MS": "20",    # an idle worker reads a new record within 20 ms (250 under
                                                         # `up` for the embedded broker; 0 against a Kafka broker)
    "CLOCKTOWER_STREAMS_LINK_QUARANTINE_FLAPS": "10000",  # --flaps downs in minutes: no quarantine here
}
AGENT_WATCHDOG_OFF_MS = 60_000.0                          # the actuator setting's maximum: beyond every down


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """os.environ with `values` set (the stack's children copy it), restored on exit."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _wait_rows(client: Any, sql: str, done: Any, timeout_s: float) -> list:  # noqa: ANN401
    deadline = time.monotonic() + timeout_s
    rows: list = []
    while time.monotonic() < deadline:
        try:
            rows = client.query(sql).result_rows
        except Exception:  # noqa: BLE001 - the sink creates its tables as it starts: ask again
            rows = []
        if done(rows):
            break
        time.sleep(0.3)
    return rows


def _on(bed: FailoverBed, link: str) -> bool:
    return all(bed.route_to_peer(host)[0] == link for host in HOSTS)


def _wait_moved(bed: FailoverBed, host: str, timeout_s: float) -> int | None:
    """When (ns since the epoch) `host`'s route to its peer was first seen on the backup (polled every ~1 ms)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if bed.route_to_peer(host)[0] == BACKUP:
            return time.time_ns()
        time.sleep(0.001)
    return None


def _record_times(bootstrap: str, topic: str, pick: Callable[[Any], str | None]) -> dict[str, int]:
    """`pick(event)` (a key, or None to skip) -> its record's timestamp (ns; set by the producer that sent it),
    for every record of `topic` (read until 3 s pass without one)."""
    from confluent_kafka import Consumer, TopicPartition

    from clocktower.schemas.codec import DecodeError, decode_batch

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"failover-bench-{time.time_ns()}",
                  "enable.auto.commit": False})
    out: dict[str, int] = {}
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        c.assign([TopicPartition(topic, p, 0) for p in parts])
        idle_until = time.monotonic() + 3.0
        while time.monotonic() < idle_until:
            msg = c.poll(0.2)
            if msg is None or msg.error():
                continue
            idle_until = time.monotonic() + 3.0
            try:
                batch = decode_batch(topic, msg.key(), msg.value(), msg.headers())
            except DecodeError:
                continue
            for event in batch.events:
                key = pick(event)
                if key is not None:
                    out.setdefault(key, msg.timestamp()[1] * 1_000_000)
    finally:
        c.close()
    return out


def _after(downs: list[int], ts: int) -> int | None:
    """The newest down at or before `ts`."""
    return max((d for d in downs if d <= ts), default=None)


def measure_pipeline(bed: FailoverBed, stream: TcpStream, flaps: int, work_dir: Path,
                     stable_s: float = 1.0) -> dict[str, Any]:
    """Hard downs of the primary with the pipeline deciding (see the module doc): real broker, stream workers,
    sink and agents; the agents' watchdogs off."""
    from clocktower.runtime.credentials import control_public_key_path
    from tests.conftest import start_pipeline

    failover_ms: list[float] = []
    moved_ms: list[float] = []
    downs: list[int] = []
    restore_ms: list[float] = []
    misses = 0
    with _environment({**PIPELINE_ENV, "CLOCKTOWER_STREAMS_LINK_STABLE_S": str(stable_s)}):
        pipeline = start_pipeline(work_dir / "ct")
    try:
        client = pipeline.client
        nodes = "(" + ",".join(f"'{bed.node(h)}'" for h in HOSTS) + ")"
        with bed.real_agents(pipeline.settings.bootstrap, work_dir / "agents",
                             control_public_key_path(pipeline.settings.data_dir),
                             watchdog_ms=AGENT_WATCHDOG_OFF_MS, report_s=0.2) as agents:
            seen = _wait_rows(client, f"SELECT DISTINCT node FROM link_states WHERE node IN {nodes} AND up",
                              lambda rows: len(rows) == len(HOSTS), 60)
            if len(seen) < len(HOSTS):
                raise RuntimeError(f"the agents' link reports did not reach ClickHouse: {seen}")
            time.sleep(stable_s)
            for _ in range(flaps):
                down_ns = time.time_ns()
                downs.append(down_ns)
                bed.hard_down()
                moved = _wait_moved(bed, "a", 10.0)
                if moved is not None:
                    moved_ms.append((moved - down_ns) / 1e6)
                on_backup = bed.monitor.flow_start("b", BACKUP, after_ns=down_ns, timeout_s=10.0)
                if on_backup is None:
                    misses += 1
                else:
                    failover_ms.append((on_backup - down_ns) / 1e6)
                time.sleep(0.1)
                bed.hard_up()
                for host in HOSTS:
                    bed.wait_carrier(host, PRIMARY, True)
                up_ns = time.time_ns()
                on_primary = bed.monitor.flow_start("b", PRIMARY, after_ns=up_ns, timeout_s=stable_s + 15.0)
                if on_primary is None:
                    misses += 1
                else:
                    restore_ms.append((on_primary - up_ns) / 1e6)
                deadline = time.monotonic() + 15.0     # both hosts restored: the incident is resolved
                while not _on(bed, PRIMARY) and time.monotonic() < deadline:
                    time.sleep(0.02)
                time.sleep(0.3)
            died = [a.host for a in agents.values() if not a.alive()]
        cmds = _wait_rows(client, f"SELECT command_id, action, node FROM control_commands FINAL WHERE node IN {nodes}",
                          lambda rows: sum(r[1] == "restore" for r in rows) >= flaps * len(HOSTS), 30)
        ids = {r[0] for r in cmds}
        acks = _wait_rows(client, f"SELECT command_id, status, ts_ns FROM control_acks WHERE node IN {nodes} "
                                  "AND origin = 'command'", lambda rows: ids <= {r[0] for r in rows}, 30)
        # where the time goes: down -> the command's record (agent, broker, stream workers) -> the ack (actuator)
        failovers = {r[0] for r in cmds if r[1] == "failover" and r[2] == bed.node("a")}
        sent = _record_times(pipeline.settings.bootstrap, "control.commands",   # host a's (whose move is timed)
                             lambda c: c.command_id if c.command_id in failovers else None)
        reported = _record_times(pipeline.settings.bootstrap, "telemetry.links",  # host a's down reports
                                 lambda e: str(e.ts_ns) if e.node == bed.node("a") and e.interface == PRIMARY
                                 and not e.up else None)
        report_at = {_after(downs, ts): ts for ts in sorted(reported.values(), reverse=True)}  # first per down
        acked_at = {r[0]: r[2] for r in acks}
        to_report, to_command, to_ack = [], [], []
        for cid, ts in sorted(sent.items(), key=lambda kv: kv[1]):
            down = _after(downs, ts)
            if down is not None and cid in acked_at:
                to_command.append((ts - down) / 1e6)
                to_ack.append((acked_at[cid] - ts) / 1e6)
                to_report.append((report_at[down] - down) / 1e6 if down in report_at else float("nan"))
        local = client.query(f"SELECT count() FROM control_acks WHERE node IN {nodes} "
                             "AND origin = 'watchdog'").result_rows[0][0]
    finally:
        pipeline.stack.stop()
    return {
        "pipeline_failover_ms_p50": round(percentile(failover_ms, 50), 2) if failover_ms else None,
        "pipeline_failover_ms_p99": round(percentile(failover_ms, 99), 2) if failover_ms else None,
        "pipeline_failover_ms_max": round(max(failover_ms), 2) if failover_ms else None,
        "pipeline_route_moved_ms_p50": round(percentile(moved_ms, 50), 2) if moved_ms else None,
        "pipeline_route_moved_ms_p99": round(percentile(moved_ms, 99), 2) if moved_ms else None,
        "pipeline_down_to_command_ms_p50": round(percentile(to_command, 50), 1) if to_command else None,
        "pipeline_command_to_ack_ms_p50": round(percentile(to_ack, 50), 1) if to_ack else None,
        "pipeline_command_to_ack_ms_max": round(max(to_ack), 1) if to_ack else None,
        # per flap, in order: down -> host a's down report's record, -> the failover's record, -> its ack
        "pipeline_down_to_report_ms_all": [round(v, 1) for v in to_report],
        "pipeline_down_to_command_ms_all": [round(v, 1) for v in to_command],
        "pipeline_command_to_ack_ms_all": [round(v, 1) for v in to_ack],
        "pipeline_route_moved_ms_all": [round(v, 1) for v in moved_ms],
        "pipeline_restore_after_up_ms_p50": round(statistics.median(restore_ms), 2) if restore_ms else None,
        "pipeline_stable_s": stable_s,
        "pipeline_commands": len(ids),
        "pipeline_acks_applied": len({r[0] for r in acks if r[1] == "applied" and r[0] in ids}),
        "pipeline_watchdog_acks": local,
        "pipeline_moves_not_seen": misses,
        "pipeline_agents_died": died,
        "pipeline_failover_ms_all": [round(v, 1) for v in failover_ms],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--flaps", type=int, default=20)
    parser.add_argument("--watchdog-ms", type=float, default=0.0)
    parser.add_argument("--mode", choices=("hard", "carrier"), default="hard")
    parser.add_argument("--rto-min-ms", type=int, default=None,
                        help="rto_min metric on the service routes (default: none, TCP's 200 ms)")
    parser.add_argument("--no-pipeline", action="store_true",
                        help="skip the pipeline-deciding part (no pipeline_* keys)")
    parser.add_argument("--stable-s", type=float, default=1.0,
                        help="T_stable of the pipeline part (CLOCKTOWER_STREAMS_LINK_STABLE_S; default 1)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2 flaps")
    args = parser.parse_args()
    if args.quick:
        args.flaps = 2
    out: dict[str, Any] = {"flaps": args.flaps, "mode": args.mode, "watchdog_delay_ms": args.watchdog_ms,
                           "rto_min_ms": args.rto_min_ms}
    with (tempfile.TemporaryDirectory(prefix="ct-failover-") as tmp,
          failover_bed("bfo", skip=False, rto_min_ms=args.rto_min_ms) as bed):
        with bed.stream() as stream:
            with bed.agents(Path(tmp), delay_s=args.watchdog_ms / 1e3) as agents:
                stream.wait_bytes(100_000)
                out.update(measure_local(bed, agents, stream, args.flaps, args.mode))
            if not args.no_pipeline:        # the bed's watchdog processes are gone: the real agents take over
                out.update(measure_pipeline(bed, stream, args.flaps, Path(tmp), args.stable_s))
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
