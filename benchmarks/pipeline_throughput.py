"""Pipeline throughput vs raw Kafka passthrough, measured in one run on one broker. Prints JSON.

1. raw: confluent-kafka produce + consume of the pipeline's own encoded records (same sizes,
   same compression), consumer running concurrently; msgs/s and the events/s they carry.
2. pipeline: simulator events published through KafkaPublisher (encoding included) -> broker ->
   the real sink process (`python -m clocktower.sinks.clickhouse`) -> rows in ClickHouse; events/s from the
   first publish until the last row is stored. Event generation is done beforehand and not timed.

Usage: python benchmarks/pipeline_throughput.py [--nodes 16] [--seconds 10] [--quick] [--profile DIR]
"""

from __future__ import annotations

import argparse
import json
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

from clocktower.config import Settings  # noqa: E402
from clocktower.ports import free_port  # noqa: E402
from clocktower.producers.kafka_publisher import KafkaPublisher  # noqa: E402
from clocktower.producers.simulator import FleetSimulator, SimConfig  # noqa: E402
from clocktower.runtime.clickhouse_client import http_client  # noqa: E402
from clocktower.stack import Stack  # noqa: E402
from clocktower.streams.emit import records  # noqa: E402
from clocktower.summary import table_rows  # noqa: E402


def generate(nodes: int, seconds: float) -> list:
    # in the past: the sink dead-letters events stamped more than CLOCKTOWER_MAX_FUTURE_SKEW_S (30 s) ahead
    sim = FleetSimulator(SimConfig(nodes=nodes, duration_s=seconds, seed=1, faults=False),
                         start_ns=time.time_ns() - int(seconds * 1e9))
    return sim.advance(sim.now_ns + int(seconds * 1e9))


def raw_passthrough(bootstrap: str, payloads: list[tuple[bytes, bytes, list]]) -> dict:
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
    base = sum(table_rows(client).values())
    publisher = KafkaPublisher(settings.bootstrap)
    spy = None if profile is None else PySpy(stack.children[sink].pid, profile / "sink.txt")
    if spy is not None:
        spy.start()
    start = time.perf_counter()
    for i in range(0, len(events), 20_000):
        publisher.publish(events[i:i + 20_000])
    publisher.flush(120)
    published = time.perf_counter() - start
    target = base + len(events)
    while sum(table_rows(client).values()) < target:
        if time.perf_counter() - start > timeout:
            raise RuntimeError("pipeline did not store every event in time")
        time.sleep(0.05)
    elapsed = time.perf_counter() - start
    stored = sum(table_rows(client).values()) - base
    out: dict[str, object] = {"events": len(events), "stored": stored, "publish_seconds": round(published, 3),
                              "seconds": round(elapsed, 3), "events_per_s": round(len(events) / elapsed)}
    if spy is not None:
        spy.stop()
        out["profile_sink"] = top_costs(spy.out)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=10.0, help="simulated seconds of fleet telemetry")
    ap.add_argument("--quick", action="store_true", help="a smaller run (8 nodes, 4 s)")
    ap.add_argument("--profile", type=Path, metavar="DIR", help="py-spy the sink while it is timed, into DIR, and "
                    "print its top costs (benchmarks/py_spy_profile.py)")
    args = ap.parse_args()
    nodes, seconds = (8, 4.0) if args.quick else (args.nodes, args.seconds)
    events = generate(nodes, seconds)
    payloads = [(r.key, r.value, r.headers) for r in records(events)]
    per_record = len(events) / len(payloads)
    tmp = Path(tempfile.mkdtemp(prefix="ct-bench-"))
    settings = Settings(data_dir=tmp, kafka_port=free_port(), http_port=free_port(), kafka_bootstrap=None,
                        clickhouse_url=None)
    stack = Stack(settings, with_streams=False, with_sink=False)
    stack.start()
    try:
        raw = raw_passthrough(settings.bootstrap, payloads)
        raw["events_per_s"] = round(raw["msgs_per_s"] * per_record)
        pipe = pipeline(settings, stack, events, profile=args.profile)
    finally:
        stack.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    ratio = pipe["events_per_s"] / raw["events_per_s"]
    print(json.dumps({
        "benchmark": "pipeline_throughput",
        "fleet": {"nodes": nodes, "gpus_per_node": 8, "simulated_seconds": seconds},
        "events_per_record": round(per_record, 1),
        "raw_passthrough": raw,
        "pipeline": pipe,
        "pipeline_vs_raw_events_ratio": round(ratio, 3),
        "goal_100k_events_per_s": pipe["events_per_s"] >= 100_000,
        "goal_half_of_raw": ratio >= 0.5,
    }, indent=2))


if __name__ == "__main__":
    main()
