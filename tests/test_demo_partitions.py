"""The demo's node names are its records' Kafka keys: the default fleet must put records in every partition of
every topic it writes, through the real publisher and the embedded broker (so the real partitioner decides)."""

from __future__ import annotations

from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from clocktower import cli
from clocktower.producers.kafka_publisher import KafkaPublisher
from clocktower.producers.simulator import FleetSimulator, SimConfig, run_simulation
from clocktower.schemas.topics import BY_SCHEMA
from clocktower.topic_admin import ensure_topics
from tests.conftest import start_services


def test_the_default_demo_fleet_uses_every_partition(tmp_path: Path) -> None:
    nodes = cli.parser().parse_args(["demo"]).nodes
    services = start_services(tmp_path / "ct")
    try:
        bootstrap = services.settings.bootstrap
        ensure_topics(bootstrap)
        publisher = KafkaPublisher(bootstrap)
        produced = run_simulation(FleetSimulator(SimConfig(nodes=nodes, duration_s=3, seed=0)), publisher, 3,
                                  realtime=False)
        assert publisher.flush(30) == 0 and not publisher.failed
        written = {BY_SCHEMA[schema] for schema in produced}
        assert {t.name for t in written if t.partitions > 1} >= {"telemetry.flows", "telemetry.clock",
                                                                  "telemetry.gpu", "telemetry.iterations"}
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "partition-check"})
        try:
            used = {t.name: sum(consumer.get_watermark_offsets(TopicPartition(t.name, p), timeout=10)[1] > 0
                                for p in range(t.partitions)) for t in written}
        finally:
            consumer.close()
        # Records are keyed by node: n nodes fill at most n partitions (telemetry.flows has 6 for the streams'
        # workers; the flow join regroups it by 5-tuple over all 6 anyway).
        short = {t.name: used[t.name] for t in written if used[t.name] < min(t.partitions, nodes)}
        assert not short, f"partitions the {nodes}-node demo leaves empty: {short}"
    finally:
        services.stack.stop()
