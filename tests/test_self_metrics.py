"""The pipeline's own Prometheus metrics: every one the pipeline-health dashboard asks for is exported, with the
labels it groups by; the actuator, the agent and the lag export move them (the last against the real broker)."""

from __future__ import annotations

import re

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest

import clocktower.producers.agent.metrics  # noqa: F401 - registers the agent's metrics
import clocktower.sinks.clickhouse.metrics  # noqa: F401 - registers the sink's metrics
import clocktower.streams.metrics  # noqa: F401 - registers the streams' metrics
from clocktower.actuators import metrics as actuator_metrics
from clocktower.dashboards import DASHBOARDS
from clocktower.runtime import lag_metrics
from clocktower.runtime.lag_metrics import ConsumerLagCollector
from tests.metric_moves import fail_to_hand, hand_to_kafka, serve_spool_metrics, signed_failover, simulated_actuator

SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}
EXPRS = [expr for b in DASHBOARDS for p in b.panels for expr, _ in p.promql]


def _exported() -> dict[str, set[str]]:
    """Every sample name the processes export -> the label names it carries (the lag family included)."""
    out: dict[str, set[str]] = {"clocktower_consumer_lag_records": {"group", "topic", "partition"}}
    for collector in list(REGISTRY._collector_to_names):   # noqa: SLF001 - labelled metrics without children yet
        labels = set(getattr(collector, "_labelnames", ()))
        for family in collector.describe() if hasattr(collector, "describe") else []:
            for suffix in SUFFIXES.get(family.type, ("",)):
                out[family.name + suffix] = labels | ({"le"} if suffix == "_bucket" else set())
    return out


def test_the_dashboard_asks_only_for_exported_metrics_and_labels() -> None:
    assert len(EXPRS) >= 10
    exported = _exported()
    for expr in EXPRS:
        names = re.findall(r"\bclocktower_\w+", expr)
        assert names, expr
        for name in names:
            assert name in exported, f"{name} is not exported ({expr})"
            for grouped in re.findall(r"by \(([^)]*)\)", expr):
                wanted = {g.strip() for g in grouped.split(",")}
                assert wanted <= exported[name], f"{expr}: {wanted - exported[name]} not labels of {name}"


def test_an_ack_counts_its_command_and_its_time_from_command_to_ack(tmp_path) -> None:
    act = simulated_actuator(tmp_path)
    before = REGISTRY.get_sample_value("clocktower_actuator_commands_total",
                                       {"action": "failover", "status": "applied"}) or 0
    seen = REGISTRY.get_sample_value("clocktower_actuator_command_to_ack_seconds_count", {"action": "failover"}) or 0
    bucket = "clocktower_actuator_command_to_ack_seconds_bucket"
    under = {le: REGISTRY.get_sample_value(bucket, {"action": "failover", "le": le}) or 0 for le in ("1.0", "2.5")}
    cmd = signed_failover("c-metrics-1", issued_s_ago=1.5)
    assert act.handle(cmd).status == "applied"
    assert act.handle(cmd).status == "refused"   # the replay: counted as refused
    assert REGISTRY.get_sample_value("clocktower_actuator_commands_total",
                                     {"action": "failover", "status": "applied"}) == before + 1
    assert REGISTRY.get_sample_value("clocktower_actuator_commands_total",
                                     {"action": "failover", "status": "refused"}) >= 1
    assert REGISTRY.get_sample_value("clocktower_actuator_command_to_ack_seconds_count",
                                     {"action": "failover"}) == seen + 1   # the applied one; a replay is not timed
    # issued 1.5 s before it was handled: the 2.5 s bucket has it, the 1 s bucket does not
    assert REGISTRY.get_sample_value(bucket, {"action": "failover", "le": "2.5"}) == under["2.5"] + 1
    assert REGISTRY.get_sample_value(bucket, {"action": "failover", "le": "1.0"}) == under["1.0"]
    forged = cmd.model_copy(update={"command_id": "c-metrics-forged", "signature": "AAAA"})
    assert act.handle(forged).status == "refused"   # counted, but its self-declared time is not measured
    assert REGISTRY.get_sample_value("clocktower_actuator_command_to_ack_seconds_count",
                                     {"action": "failover"}) == seen + 1
    refused = REGISTRY.get_sample_value("clocktower_actuator_commands_total", {"action": "", "status": "refused"}) or 0
    act.refuse("garbled", "not a command record")
    assert REGISTRY.get_sample_value("clocktower_actuator_commands_total",
                                     {"action": "", "status": "refused"}) == refused + 1
    act.close()


def test_the_agent_counts_what_it_hands_to_kafka_and_shows_its_spool() -> None:
    before = REGISTRY.get_sample_value("clocktower_agent_events_total", {"schema": "heartbeat"}) or 0
    hand_to_kafka(3)
    assert REGISTRY.get_sample_value("clocktower_agent_events_total", {"schema": "heartbeat"}) == before + 3
    dropped = REGISTRY.get_sample_value("clocktower_agent_events_dropped_total") or 0
    fail_to_hand(1)
    assert REGISTRY.get_sample_value("clocktower_agent_events_dropped_total") == dropped + 1
    spool = serve_spool_metrics(records=7, events=70)   # the agent's wiring, no server
    assert REGISTRY.get_sample_value("clocktower_agent_spool_records") == 7
    spool.pending_records = 0   # read when scraped
    assert REGISTRY.get_sample_value("clocktower_agent_spool_records") == 0
    assert REGISTRY.get_sample_value("clocktower_agent_spool_events") == 70


def test_consumer_lag_is_read_from_the_broker_when_scraped(services) -> None:
    bootstrap, topic, group = services.settings.bootstrap, "telemetry.heartbeats", "clocktower-lag-test"
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(10):
        producer.produce(topic, key=b"n", value=b"x%d" % i, partition=0)
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    end = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)[1]
    consumer.commit(offsets=[TopicPartition(topic, 0, end - 4)], asynchronous=False)   # 4 left to commit
    consumer.close()
    registry = CollectorRegistry()
    clock = [0.0]
    collector = ConsumerLagCollector(bootstrap, {group: [topic]}, ttl_s=5.0, clock=lambda: clock[0])
    registry.register(collector)
    labels = {"group": group, "topic": topic, "partition": "0"}
    assert registry.get_sample_value("clocktower_consumer_lag_records", labels) == 4
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    consumer.commit(offsets=[TopicPartition(topic, 0, end)], asynchronous=False)
    consumer.close()
    assert registry.get_sample_value("clocktower_consumer_lag_records", labels) == 4   # within ttl: the read kept
    clock[0] = 6.0
    assert registry.get_sample_value("clocktower_consumer_lag_records", labels) == 0


def test_a_broker_away_gives_no_lag_and_counts_the_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def unreachable(*args: object, **kwargs: object) -> list[dict]:
        raise RuntimeError("broker unreachable")

    monkeypatch.setattr(lag_metrics, "consumer_lag", unreachable)
    registry = CollectorRegistry()
    registry.register(ConsumerLagCollector("127.0.0.1:1", {"g-away": ["t"]}))
    before = REGISTRY.get_sample_value("clocktower_consumer_lag_read_errors_total", {"group": "g-away"}) or 0
    assert "clocktower_consumer_lag_records{" not in generate_latest(registry).decode()
    assert REGISTRY.get_sample_value("clocktower_consumer_lag_read_errors_total", {"group": "g-away"}) == before + 1
    assert actuator_metrics.COMMANDS is not None


def test_compose_prometheus_scrapes_the_ports_the_services_serve_and_grafana_reads_it() -> None:
    from pathlib import Path

    import yaml

    root = Path(__file__).resolve().parents[1]
    compose = yaml.safe_load((root / "docker-compose.yml").read_text())["services"]
    scrape = yaml.safe_load((root / "grafana/prometheus/prometheus.yml").read_text())["scrape_configs"]
    targets = [t for job in scrape for c in job["static_configs"] for t in c["targets"]]
    assert {t.split(":")[0] for t in targets} == {"sink", "streams"}
    for target in targets:
        service, port = target.split(":")
        env = {k: str(v) for k, v in compose[service]["environment"].items()}
        served = {v for k, v in env.items() if k.endswith("METRICS_PORT")}
        assert port in served and env["CLOCKTOWER_METRICS_HOST"] == "0.0.0.0", (service, env)
        assert "ports" not in compose["prometheus"], "Prometheus is for Grafana on the compose network only"
    ds = yaml.safe_load((root / "grafana/provisioning/datasources/prometheus.yaml").read_text())["datasources"][0]
    assert ds["uid"] == "clocktower-prom" and ds["url"].endswith(":9090")
