"""CLOCKTOWER_BROKER_PROFILE: the embedded broker's workarounds run only with `embedded` (runtime/broker_profile.py)."""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path

import aiokafka.consumer.group_coordinator as group_coordinator
import pytest
from confluent_kafka import TopicPartition

from clocktower import agent_cli
from clocktower.actuators.settings import ActuatorSettings
from clocktower.producers.agent.config import AgentSettings
from clocktower.runtime.broker_profile import PROFILES, WORKAROUNDS, profile_settings
from clocktower.sinks.clickhouse.kafka_sink import KafkaClickHouseSink
from clocktower.sinks.clickhouse.resume import ResumePoint
from clocktower.sinks.clickhouse.settings import SinkSettings
from clocktower.streams.engine import group_join
from clocktower.streams.settings import StreamsSettings

README = Path(__file__).parent.parent / "README.md"


def test_the_readme_table_is_the_list_of_workarounds() -> None:
    text = README.read_text()
    table = text[text.index("| workaround | where |"):]
    lines = table.splitlines()[2:]
    lines = lines[:next(i for i, line in enumerate(lines) if not line.startswith("|"))]   # the table's rows
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
    assert rows == [[w.name, w.where, w.compensates, w.kafka_instead] for w in WORKAROUNDS]
    assert re.search(r"`CLOCKTOWER_BROKER_PROFILE` \| `kafka`", text)


def test_kafka_the_default_turns_every_workaround_off_and_embedded_on(monkeypatch: pytest.MonkeyPatch) -> None:
    kafka, embedded = PROFILES["kafka"], PROFILES["embedded"]
    assert (kafka.idle_fetch_backoff_s, kafka.actuator_idle_backoff_s, kafka.ack_hold_s) == (0, 0, 0)
    assert not kafka.rejoin_on_empty_assignment and not kafka.check_reused_offsets
    assert embedded.idle_fetch_backoff_s > 0 and embedded.actuator_idle_backoff_s > 0 and embedded.ack_hold_s > 0
    assert embedded.rejoin_on_empty_assignment and embedded.check_reused_offsets
    monkeypatch.delenv("CLOCKTOWER_BROKER_PROFILE", raising=False)
    for settings in (StreamsSettings(), SinkSettings(), ActuatorSettings(), AgentSettings()):
        assert settings.broker_profile == "kafka"
    monkeypatch.setenv("CLOCKTOWER_BROKER_PROFILE", "embedded")   # one variable, whatever a service's prefix
    for settings in (StreamsSettings(), SinkSettings(), ActuatorSettings(), AgentSettings()):
        assert settings.broker_profile == "embedded"
    assert ActuatorSettings().idle_backoff_s == embedded.actuator_idle_backoff_s
    monkeypatch.setenv("CLOCKTOWER_BROKER_PROFILE", "redpanda")
    with pytest.raises(ValueError, match="'embedded' or 'kafka'"):
        StreamsSettings()


class _LogBounds:
    """What the sink asks of its consumer here: a partition's log bounds."""

    def __init__(self, low: int, high: int) -> None:
        self.bounds = (low, high)

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float) -> tuple[int, int]:
        return self.bounds


def _sink(check: bool) -> KafkaClickHouseSink:
    return KafkaClickHouseSink("127.0.0.1:9", None, topics=["telemetry.gpu"], instance_id="t",  # type: ignore[arg-type]
                               check_reused_offsets=check)


def test_the_sink_checks_for_reused_offsets_only_when_asked() -> None:
    """Without the check a resume point inside the log is taken as it is, and no record is probed; one outside the
    log (a topic made anew) is searched all the same, or the sink would fetch out of range for ever."""
    tp, deadline = TopicPartition("telemetry.gpu", 0), time.monotonic() + 1
    point, _ = _sink(False)._resume_point(_LogBounds(0, 10), None, tp, committed=5, stored=7,  # type: ignore[arg-type]
                                          deadline=deadline)
    assert point == ResumePoint(7)
    for sink, bounds in ((_sink(True), (0, 10)), (_sink(False), (0, 3))):
        with pytest.raises(AttributeError):   # it probes the records (no probe consumer here)
            sink._resume_point(_LogBounds(*bounds), None, tp, committed=5, stored=7,  # type: ignore[arg-type]
                               deadline=deadline)


@pytest.mark.parametrize("profile", ["kafka", "embedded"])
def test_the_sink_accepts_fetch_responses_over_100_mb_only_with_the_embedded_broker(
        monkeypatch: pytest.MonkeyPatch, profile: str) -> None:
    """Issue 18 finding 1 (the actuator's half runs against the broker in test_actuator_consumer.py): a 108 MB
    response froze the sink's lag in every table. Its consumer and its probe consumer take the profile's ceiling."""
    from clocktower.sinks.clickhouse import __main__ as sink_main
    from clocktower.sinks.clickhouse import kafka_sink

    configs: list[dict] = []
    monkeypatch.setattr(kafka_sink, "Consumer", lambda conf: configs.append(conf))
    monkeypatch.setattr(kafka_sink, "Producer", lambda conf: None)
    sink = sink_main.sink_for(SinkSettings(broker_profile=profile), None)  # type: ignore[arg-type]
    configs.append(sink._probe_config)
    ceilings = [c.get("receive.message.max.bytes") for c in configs]
    assert ceilings == ([2_147_483_647] * 2 if profile == "embedded" else [None] * 2)
    # and it pauses between fetches once caught up only with the embedded broker (a Kafka broker holds the fetch)
    assert sink.trickle_backoff_s == (0.1 if profile == "embedded" else 0.0)


def test_the_stream_worker_rejoins_on_an_empty_assignment_only_with_the_embedded_broker() -> None:
    original = group_coordinator.CoordinatorGroupRebalance
    routine = group_coordinator.GroupCoordinator._coordination_routine
    try:
        group_join.install(rejoin_on_empty=False)
        assert group_coordinator.CoordinatorGroupRebalance is group_join._original_rebalance
        group_join.install(rejoin_on_empty=True)
        assert group_coordinator.CoordinatorGroupRebalance is group_join.RejoinOnEmptyAssignment
    finally:
        group_coordinator.CoordinatorGroupRebalance = original
        group_coordinator.GroupCoordinator._coordination_routine = routine


@pytest.mark.parametrize("profile", ["kafka", "embedded"])
def test_the_agent_holds_acked_records_only_for_the_embedded_broker(tmp_path: Path, profile: str) -> None:
    settings = AgentSettings(spool_dir=tmp_path / "spool", broker_profile=profile)
    publisher = agent_cli._publisher("127.0.0.1:9", settings)
    try:
        assert publisher._hold.hold_s == profile_settings(profile).ack_hold_s   # type: ignore[arg-type]
    finally:
        publisher.close()


def test_the_agent_pointed_at_the_broker_on_this_host_takes_it_for_the_embedded_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CLOCKTOWER_BROKER_PROFILE", raising=False)
    assert agent_cli._profile(argparse.Namespace(kafka_port=19092)) == {"broker_profile": "embedded"}
    assert agent_cli._profile(argparse.Namespace(kafka_port=None)) == {}           # --kafka HOST:PORT, or the env
    monkeypatch.setenv("CLOCKTOWER_BROKER_PROFILE", "kafka")
    assert agent_cli._profile(argparse.Namespace(kafka_port=19092)) == {}          # told otherwise
