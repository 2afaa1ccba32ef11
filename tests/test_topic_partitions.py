"""Topic setup on a real broker: the streams' own topics are made, an input topic that is only regrouped is
grown to the registry's count, and a topic that holds stream state by partition is never grown."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from clocktower.runtime.errors import UserError
from clocktower.schemas.topics import BY_NAME
from clocktower.streams.registry import internal_topics, stateful_topics
from clocktower.topic_admin import ensure_topics
from tests.standalone_broker import StandaloneBroker

pytestmark = pytest.mark.e2e


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[StandaloneBroker]:
    b = StandaloneBroker(tmp_path / "kafka")
    b.start()
    try:
        yield b
    finally:
        b.stop()


def _partitions(admin: AdminClient) -> dict[str, int]:
    return {n: len(t.partitions) for n, t in admin.list_topics(timeout=10).topics.items()}


def test_setup_makes_internal_topics_and_grows_only_regrouped_inputs(broker: StandaloneBroker) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for f in admin.create_topics([NewTopic("telemetry.flows", 4, 1)]).values():   # made by an older release
        f.result(10)
    ensure_topics(broker.bootstrap)
    have = _partitions(admin)
    assert have["telemetry.flows"] == BY_NAME["telemetry.flows"].partitions == 6
    assert {t.name: t.partitions for t in internal_topics()}.items() <= have.items()
    assert "telemetry.flows" not in stateful_topics() and "telemetry.links" in stateful_topics()


def test_a_topic_backing_state_by_partition_is_not_grown(broker: StandaloneBroker) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for f in admin.create_topics([NewTopic("telemetry.gpu", 1, 1)]).values():   # the GPU detector's input
        f.result(10)
    with pytest.raises(UserError, match="telemetry.gpu .1 partitions, wants 2"):
        ensure_topics(broker.bootstrap)
    assert _partitions(admin)["telemetry.gpu"] == 1


def test_the_demo_starts_its_streams_from_no_state(broker: StandaloneBroker, tmp_path: Path) -> None:
    """Each demo run simulates a new fleet: the last run's changelogs and local stores are removed."""
    from clocktower.stream_state import reset_stream_state
    from clocktower.streams.detectors.gpu_fault import GpuFaultDetector
    from clocktower.streams.registry import changelog_topic

    ensure_topics(broker.bootstrap)
    (tmp_path / "streams" / "worker" / "v1").mkdir(parents=True)
    gone = reset_stream_state(broker.bootstrap, tmp_path)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    assert changelog_topic(GpuFaultDetector) in gone and not (tmp_path / "streams").exists()
    assert not set(gone) & set(_partitions(admin))
    ensure_topics(broker.bootstrap)   # and the setup makes them again, empty
    assert set(gone) <= set(_partitions(admin))


def test_commands_follow_the_real_partition_count_the_actuators_read(broker: StandaloneBroker) -> None:
    """An operator-made control.commands with 7 partitions (not the registry's 4): the streams route by 7, the
    partition a node's actuator assigns itself."""
    from clocktower.control.intent import CommandIntent
    from clocktower.control.issuer import CommandIssuer
    from clocktower.schemas.partitioning import partition_of
    from clocktower.streams import emit
    from clocktower.streams.command_topic import command_partitions
    from tests.control_keys import TEST_SIGNER

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    assert command_partitions(broker.bootstrap, {}, timeout_s=5) == BY_NAME["control.commands"].partitions
    for f in admin.create_topics([NewTopic("control.commands", 7, 1)]).values():
        f.result(10)
    assert command_partitions(broker.bootstrap, {}) == 7
    cmds = [CommandIssuer(TEST_SIGNER).issue(CommandIntent(f"node-{i}", "drain", f"node-{i}", 1_780_000_000 * 10**9))
            for i in range(12)]
    emit.use_command_partitions(7)
    try:
        parts = {out.partition for c in cmds for out in emit.records([c])}
        assert parts == {partition_of(c.node, 7) for c in cmds} and max(parts) >= 4   # beyond the registry's 4
    finally:
        emit.use_command_partitions(0)


def test_the_control_topics_keep_a_bounded_number_of_bytes(broker: StandaloneBroker) -> None:
    """Issue 18, finding 1: a flood written to the topics the actuators and the allocator read is bounded by what
    the broker keeps. A topic made before the cap (by an older release) gets it too."""
    from confluent_kafka.admin import ConfigResource

    from clocktower.schemas.topics import CONTROL_RETENTION_BYTES, CONTROL_SEGMENT_BYTES

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for f in admin.create_topics([NewTopic("control.acks", 1, 1),                  # made without the cap
                                  NewTopic("control.replacements", 1, 1, config={"retention.bytes": "1000000"})]
                                 ).values():                                        # an operator's lower cap
        f.result(10)
    ensure_topics(broker.bootstrap)
    described = admin.describe_configs([ConfigResource("topic", t) for t in [
        "control.commands", "control.acks", "control.replacements", "telemetry.gpu"]])
    got = {res.name: (c["retention.bytes"].value, c["segment.bytes"].value)
           for res, fut in described.items() for c in [fut.result(10)]}
    cap = (str(CONTROL_RETENTION_BYTES), str(CONTROL_SEGMENT_BYTES))
    assert got["control.commands"] == got["control.acks"] == cap
    assert got["control.replacements"] == ("1000000", str(CONTROL_SEGMENT_BYTES))
    assert got["telemetry.gpu"][0] == "-1"
