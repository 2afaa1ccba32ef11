"""Pipeline throughput vs raw Kafka passthrough, measured in one run on one broker. Prints JSON.

1. raw: confluent-kafka produce + consume of the pipeline's own encoded records (same sizes,
   same compression), consumer running concurrently; msgs/s and the events/s they carry.
2. pipeline: simulator events published through KafkaPublisher (encoding included) -> broker ->
   the real sink process (`python -m clocktower.sinks.clickhouse`) -> rows in ClickHouse; events/s from the
   first publish until the last row is stored (`sink_events_per_s`). Event generation is done beforehand and
   not timed.
3. streams alone: one stream worker (`python -m clocktower.streams`) over a backlog of a smaller fleet's events,
   published before it starts; events/s from a stable group until no lag is left, its user + system CPU per
   event (`streams_cpu_us_per_event`) and its peak RSS.
4. end to end: broker, ClickHouse, the sink and one stream worker, the same smaller fleet's events published
   into the running pipeline; once no consumer group has lag left (every input and derived row is stored),
   events/s from the first publish until the last row was stored (`end_to_end_events_per_s`,
   `end_to_end_vs_raw`), and each process's RSS.
5. `--soak SECONDS`: the whole pipeline fed in real time at 70 % of that rate (or at `--soak-rate`: live records
   carry about 15 events, 0.1 s of a node, against the hundreds of the batches step 4 publishes, and a record's
   fixed costs make the sustainable live rate lower); lag and RSS every 10 s.

Usage: python benchmarks/pipeline_throughput.py [--nodes 16] [--seconds 10] [--quick] [--profile DIR]
       [--soak SECONDS [--soak-rate EVENTS_PER_S] [--soak-only]]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from py_spy_profile import PySpy, top_costs  # noqa: E402
from streams_scaling import _cpu_s, process_backlog, rss_mb, wait_stable  # noqa: E402

from clocktower.config import Settings  # noqa: E402
from clocktower.demo import _wait_for_tables  # noqa: E402
from clocktower.ports import free_port  # noqa: E402
from clocktower.producers.kafka_publisher import KafkaPublisher  # noqa: E402
from clocktower.producers.simulator import FleetSimulator, SimConfig, run_simulation  # noqa: E402
from clocktower.runtime.clickhouse_client import http_client  # noqa: E402
from clocktower.schemas.topics import TOPICS  # noqa: E402
from clocktower.stack import Stack  # noqa: E402
from clocktower.streams.emit import records  # noqa: E402
from clocktower.topic_admin import consumer_lag  # noqa: E402


def generate(nodes: int, seconds: float) -> list:
    # in the past: the sink dead-letters events stamped more than CLOCKTOWER_MAX_FUTURE_SKEW_S (30 s) ahead
    sim = FleetSimulator(SimConfig(nodes=nodes, duration_s=seconds, seed=1, faults=False),
                         start_ns=time.time_ns() - int(seconds * 1e9))
    return sim.advance(sim.now_ns + int(seconds * 1e9))


def stored_rows(client) -> int:  # noqa: ANN001 - a clickhouse-connect client
    """Rows in every table of the pipeline, in one cheap query (active parts' row counts): the timed loops poll
    it every 50 ms, and a count() of each table, FINAL where it replaces, was 19 queries a poll on the same 2
    cores as what they time. Counts inserted rows, before any replacing merge."""
    tables = ", ".join(f"'{t.table}'" for t in TOPICS)
    return int(client.query("SELECT sum(rows) FROM system.parts WHERE active AND database = currentDatabase() "
                            f"AND table IN ({tables})").result_rows[0][0] or 0)


def raw_passthrough(bootstrap: str, payloads: list[tuple[bytes, bytes, list]], repeat: int = 1) -> dict:
    """`payloads` sent `repeat` times over: a few hundred records alone pass in well under a second, where a
    consume's timeout and the producer's linger made the figure jump between about 83k and 163k events/s."""
    payloads = payloads * repeat
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic("bench.raw", num_partitions=4, replication_factor=1)])["bench.raw"].result(15)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-raw", "auto.offset.reset": "earliest",
                         "enable.auto.commit": False, "session.timeout.ms": 6000})
    consumer.subscribe(["bench.raw"])
    while not consumer.assignment():
        consumer.poll(0.1)
    n = len(payloads)
    got = [0]

    def consume() -> None:
        while got[0] < n:
            got[0] += sum(1 for m in consumer.consume(1000, 0.2) if not m.error())

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1_000_000,
                         "compression.type": "lz4", "enable.idempotence": True, "acks": "all",
                         "queue.buffering.max.kbytes": 512 * 1024})
    t = threading.Thread(target=consume)
    start = time.perf_counter()
    t.start()
    for key, value, headers in payloads:
        while True:
            try:
                producer.produce("bench.raw", key=key, value=value, headers=headers)
                break
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)
    producer.flush(60)
    t.join(120)
    elapsed = time.perf_counter() - start
    consumer.close()
    return {"records": n, "seconds": round(elapsed, 3), "msgs_per_s": round(n / elapsed)}


def pipeline(settings: Settings, stack: Stack, events: list, timeout: float = 300,
             profile: Path | None = None) -> dict:
    client = http_client(settings.clickhouse, *settings.clickhouse_login())
    sink = stack.start_worker("sink")
    deadline = time.monotonic() + 60
    while not client.query("SELECT count() FROM system.tables WHERE name='deadletter'").result_rows[0][0]:
        if time.monotonic() > deadline:
            raise RuntimeError("sink did not start")
        time.sleep(0.2)
    time.sleep(2)  # let it join the group
    base = stored_rows(client)
    publisher = KafkaPublisher(settings.bootstrap)
    spies = {} if profile is None else {
        "profile_sink": PySpy(stack.children[sink].pid, profile / "sink.txt"),
        "profile_clickhouse": PySpy(stack.children["clickhouse"].pid, profile / "clickhouse.txt")}
    for spy in spies.values():
        spy.start()
    pids = {name: child.pid for name, child in stack.children.items() if child.alive()}
    pids["publisher"] = os.getpid()
    cpu0 = {name: _cpu_s(pid) for name, pid in pids.items()}
    start = time.perf_counter()
    for i in range(0, len(events), 20_000):
        publisher.publish(events[i:i + 20_000])
    publisher.flush(120)
    published = time.perf_counter() - start
    target = base + len(events)
    while stored_rows(client) < target:
        if time.perf_counter() - start > timeout:
            raise RuntimeError("pipeline did not store every event in time")
        time.sleep(0.05)
    elapsed = time.perf_counter() - start
    cpu = {name: _cpu_s(pid) - cpu0[name] for name, pid in pids.items()}
    stored = stored_rows(client) - base
    out: dict[str, object] = {"events": len(events), "stored": stored, "publish_seconds": round(published, 3),
                              "seconds": round(elapsed, 3), "events_per_s": round(len(events) / elapsed),
                              # user + system CPU of each process over the run, per event: where the time goes
                              "cpu_us_per_event": {k: round(v / len(events) * 1e6, 2) for k, v in cpu.items()}}
    for name, spy in spies.items():
        spy.stop()
        out[name] = top_costs(spy.out)
    return out


def _publish(bootstrap: str, events: list) -> None:
    publisher = KafkaPublisher(bootstrap)
    for i in range(0, len(events), 20_000):
        publisher.publish(events[i:i + 20_000])
    if publisher.flush(120):
        raise RuntimeError("not every event was acknowledged by the broker")


def _stack(root: Path, **kwargs: object) -> Stack:
    settings = Settings(data_dir=root, kafka_port=free_port(), http_port=free_port(), kafka_bootstrap=None,
                        clickhouse_url=None)
    stack = Stack(settings, extra_env={"CLOCKTOWER_REMEDIATION_MAX_PER_HOUR": "1000"}, **kwargs)
    stack.start()
    return stack


def _running_pipeline(root: Path) -> Stack:
    """Every service started (broker, ClickHouse, the sink, one stream worker), the sink's tables made and the
    streams' group stable: ready for records."""
    stack = _stack(root)
    _wait_for_tables(http_client(stack.s.clickhouse, *stack.s.clickhouse_login()), stack)
    wait_stable(stack.s.bootstrap, 1)
    return stack


def _lag_left(stack: Stack) -> int:
    """Records every consumer group (sink and streams) has still to read."""
    return sum(_lag_by_group(stack).values())


def _lag_by_group(stack: Stack) -> dict[str, int]:
    """Records each consumer group has still to read: which of the sink and the streams falls behind."""
    out: dict[str, int] = {}
    for r in consumer_lag(stack.s.bootstrap):
        out[r["group"]] = out.get(r["group"], 0) + r["lag"]
    return out


def _rss(stack: Stack) -> dict[str, float]:
    return {name: rss_mb(child.pid) for name, child in stack.children.items() if child.alive()}


def streams_alone(events: list, root: Path, profile: Path | None) -> dict:
    """One stream worker over a backlog of `events` (published before it starts, not timed)."""
    stack = _stack(root / "streams", with_streams=False, with_sink=False)
    try:
        _publish(stack.s.bootstrap, events)
        r = process_backlog(stack, len(events), 1, profile)
    finally:
        stack.stop()
    out = {"streams_events_per_s": r["workers_1_events_per_s"],
           "streams_cpu_us_per_event": r["cpu_s_per_1m_events_per_worker_1"],   # s per 1M events = us per event
           "streams_rss_mb_peak": r["rss_mb_peak_per_worker_1"][0]}
    if "profile_worker_of_1" in r:
        out["profile_streams"] = r["profile_worker_of_1"]
    return out


def end_to_end(events: list, root: Path, timeout: float = 600) -> dict:
    """Every service running (broker, ClickHouse, the sink, one stream worker): once no group has lag left (the
    sink commits after its insert: every input and derived row is stored), the time from the first publish until
    the last row was stored, to the poll loop's precision (a lag query, a count and 0.2 s)."""
    stack = _running_pipeline(root / "e2e")
    try:
        client = http_client(stack.s.clickhouse, *stack.s.clickhouse_login())
        base = stored_rows(client)
        start = time.perf_counter()
        _publish(stack.s.bootstrap, events)
        zero_at, rows, stored_at = None, base, start
        while True:
            left = _lag_left(stack)
            now = time.perf_counter()
            if (n := stored_rows(client)) > rows:   # a replacing merge may only drop duplicates
                rows, stored_at = n, now     # when the last row so far was stored (to the poll's 0.2 s)
            if left == 0 and zero_at is not None:
                break                        # twice in a row: the streams may emit after the first
            zero_at = now if left == 0 else None
            if now - start > timeout:
                raise RuntimeError(f"the pipeline did not drain within {timeout:.0f} s ({left} records left)")
            stack.supervise()
            time.sleep(0.2)
        # Until the last row was stored, not until the groups' commits caught up with it (the streams commit
        # every 2.8 s, Faust's default: a commit's wait is not a cost of the events)
        if rows == base:
            raise RuntimeError("the pipeline stored no row")
        elapsed = stored_at - start
        stored = rows - base
        rss = _rss(stack)
    finally:
        stack.stop()
    return {"end_to_end_events_per_s": round(len(events) / elapsed), "end_to_end_seconds": round(elapsed, 2),
            "rows_stored": stored, "derived_rows": stored - len(events), "rss_mb": rss}


def soak(rate: float, per_node: float, seconds: float, root: Path, every_s: float = 10.0,
         profile: Path | None = None) -> dict:
    """The whole pipeline fed in real time at about `rate` events/s, in whole simulated nodes of `per_node`
    events/s each, for `seconds`: every `every_s`, the lag left per group and each process's RSS (both should
    stay flat), and each process's CPU per event over the run. With `profile`, py-spy records the stream worker
    and the sink over the second half."""
    nodes = max(2, round(rate / per_node))
    stack = _running_pipeline(root / "soak")
    samples: list[dict] = []
    spies: dict[str, PySpy] = {}
    try:
        pids = {name: child.pid for name, child in stack.children.items() if child.alive()}
        if profile is not None:
            spies = {f"soak_profile_{name}": PySpy(pids[name], profile / f"soak_{name}.txt")
                     for name in ("streams", "sink") if name in pids}
        t0 = time.monotonic()
        due = [t0 + every_s]
        cpu0 = {name: _cpu_s(pid) for name, pid in pids.items()}

        def sample(_: FleetSimulator) -> None:
            if time.monotonic() >= due[0]:
                due[0] += every_s
                stack.supervise()
                lags = _lag_by_group(stack)
                samples.append({"t_s": round(time.monotonic() - t0), "lag": sum(lags.values()), "lag_by_group": lags,
                                "rss_mb": _rss(stack)})
                print(f"soak {samples[-1]}", file=sys.stderr, flush=True)   # progress on long runs
                if spies and not spies_started and samples[-1]["t_s"] >= seconds / 2:
                    spies_started.append(True)
                    for spy in spies.values():
                        spy.start()

        spies_started: list[bool] = []
        sim = FleetSimulator(SimConfig(nodes=nodes, duration_s=seconds, seed=5, faults=False))
        published = run_simulation(sim, KafkaPublisher(stack.s.bootstrap), seconds, realtime=True, on_tick=sample)
        sent = max(1, sum(published.values()))
        # a process the supervisor restarted during the soak has no CPU figure: its first life's time is gone
        alive = {name: child.pid for name, child in stack.children.items() if child.alive()}
        cpu = {name: round((_cpu_s(pid) - cpu0[name]) / sent * 1e6, 2) for name, pid in pids.items()
               if alive.get(name) == pid}
        out: dict[str, object] = {"soak_nodes": nodes, "soak_events_per_s": round(sent / seconds),
                                  "soak_cpu_us_per_event": cpu, "soak_samples": samples}
        for name, spy in spies.items():
            if spies_started:
                spy.stop()
                out[name] = top_costs(spy.out)
    finally:
        stack.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=10.0, help="simulated seconds of fleet telemetry")
    ap.add_argument("--quick", action="store_true", help="a smaller run (8 nodes, 4 s; streams: 2 nodes, 2 s)")
    ap.add_argument("--profile", type=Path, metavar="DIR",
                    help="py-spy the sink, the ClickHouse endpoint and the stream worker while each is timed alone, "
                    "into DIR, and print their top costs (benchmarks/py_spy_profile.py)")
    ap.add_argument("--soak", type=float, metavar="SECONDS", help="then feed the whole pipeline in real time at 70 %% "
                    "of the measured end-to-end rate for SECONDS, reporting lag and RSS every 10 s")
    ap.add_argument("--soak-rate", type=float, metavar="EVENTS_PER_S", help="the soak's rate instead of 70 %% of the "
                    "end-to-end rate")
    ap.add_argument("--soak-only", action="store_true", help="only the soak, at --soak-rate (with --profile: py-spy "
                    "of the stream worker and the sink over its second half)")
    args = ap.parse_args()
    if args.soak_only:
        if not (args.soak and args.soak_rate):
            ap.error("--soak-only needs --soak SECONDS and --soak-rate EVENTS_PER_S")
        return soak_only(args.soak, args.soak_rate, args.profile)
    nodes, seconds = (8, 4.0) if args.quick else (args.nodes, args.seconds)
    events = generate(nodes, seconds)
    # the streams path is far slower than the sink's: its runs take a smaller fleet, so that a run stays short
    s_nodes, s_seconds = (2, 2.0) if args.quick else (max(2, nodes // 2), seconds)
    streams_events = generate(s_nodes, s_seconds)
    payloads = [(r.key, r.value, r.headers) for r in records(events)]
    per_record = len(events) / len(payloads)
    tmp = Path(tempfile.mkdtemp(prefix="ct-bench-"))
    try:
        stack = _stack(tmp / "sink", with_streams=False, with_sink=False)
        try:
            raw = raw_passthrough(stack.s.bootstrap, payloads, repeat=1 if args.quick else 5)
            raw["events_per_s"] = round(raw["msgs_per_s"] * per_record)
            pipe = pipeline(stack.s, stack, events, profile=args.profile)
        finally:
            stack.stop()
        streams = streams_alone(streams_events, tmp, args.profile)
        e2e = end_to_end(streams_events, tmp)
        per_node = len(streams_events) / (s_nodes * s_seconds)   # events/s of one simulated node
        rate = args.soak_rate or 0.7 * e2e["end_to_end_events_per_s"]
        soaked = soak(rate, per_node, args.soak, tmp, profile=args.profile) if args.soak else {}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    ratio = pipe["events_per_s"] / raw["events_per_s"]
    print(json.dumps({
        "benchmark": "pipeline_throughput",
        "fleet": {"nodes": nodes, "gpus_per_node": 8, "simulated_seconds": seconds},
        "streams_fleet": {"nodes": s_nodes, "gpus_per_node": 8, "simulated_seconds": s_seconds,
                          "events": len(streams_events)},
        "events_per_record": round(per_record, 1),
        "raw_events_per_s": raw["events_per_s"],
        "sink_events_per_s": pipe["events_per_s"],
        **streams,
        **e2e,
        "end_to_end_vs_raw": round(e2e["end_to_end_events_per_s"] / raw["events_per_s"], 4),
        **soaked,
        "raw_passthrough": raw,
        "pipeline": pipe,
        "pipeline_vs_raw_events_ratio": round(ratio, 3),
        "goal_100k_events_per_s": pipe["events_per_s"] >= 100_000,
        "goal_half_of_raw": ratio >= 0.5,
    }, indent=2))


def soak_only(seconds: float, rate: float, profile: Path | None) -> None:
    per_node = len(generate(8, 10.0)) / 80.0   # events/s of one simulated node, measured as the full run does
    tmp = Path(tempfile.mkdtemp(prefix="ct-bench-"))
    try:
        soaked = soak(rate, per_node, seconds, tmp, profile=profile)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps({"benchmark": "pipeline_throughput", **soaked}, indent=2))


if __name__ == "__main__":
    main()
