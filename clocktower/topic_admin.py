"""Create the registry's topics and read their offsets."""

from __future__ import annotations

from collections.abc import Collection, Mapping

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from clocktower import topic_config
from clocktower.runtime.consumer_lag import consumer_lag as read_lag
from clocktower.schemas.kafka_security import KafkaSecurity
from clocktower.schemas.topics import TOPICS
from clocktower.streams.registry import internal_topics, stateful_topics, streams_reads


def ensure_topics(bootstrap: str, timeout: float = 15.0, security: KafkaSecurity | None = None,
                  disable_auto_create: bool = False) -> list[str]:
    """Create every missing registry topic and the streams' internal topics (repartition, changelog), raise
    existing ones' record size limit and partition count; returns the names created.

    `disable_auto_create` (the embedded broker only) turns the broker's topic auto-creation off first."""
    # log_level 4: warnings and errors only (librdkafka's info lines, e.g. BGQUEUE on close, are not for users)
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 4, **(security or KafkaSecurity()).librdkafka()})
    if disable_auto_create:
        topic_config.disable_auto_create(admin, timeout)
    existing = set(admin.list_topics(timeout=timeout).topics)
    topic_config.raise_record_limit(admin, [t.name for t in TOPICS if t.name in existing], timeout)
    topic_config.cap_bytes(admin, {t.name: {k: int(t.config[k]) for k in ("retention.bytes", "segment.bytes")}
                                   for t in TOPICS if t.name in existing and t.retention_bytes is not None}, timeout)
    wanted = [(t.name, t.partitions, t.config) for t in TOPICS]
    wanted += [(t.name, t.partitions, t.config) for t in internal_topics()]
    topic_config.raise_partitions(admin, {n: p for n, p, _ in wanted if n in existing}, timeout,
                                  fixed=stateful_topics())
    new = [NewTopic(n, num_partitions=p, replication_factor=1, config=c) for n, p, c in wanted if n not in existing]
    created = []
    for name, fut in (admin.create_topics(new, request_timeout=timeout).items() if new else ()):
        try:
            fut.result(timeout)
            created.append(name)
        except KafkaException as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise
    return created


# Who reads what: the sink stores every topic; the streams read what their processors consume and their own
# repartition topics (streams/registry.py).
READERS: dict[str, tuple[str, ...]] = {
    "clocktower-sink": tuple(t.name for t in TOPICS),
    "clocktower-streams": streams_reads(),
}


def consumer_lag(bootstrap: str, readers: Mapping[str, Collection[str]] = READERS, timeout: float = 10.0,
                 security: KafkaSecurity | None = None) -> list[dict]:
    """runtime/consumer_lag.py's rows for `readers` (default: the sink's and the streams' groups)."""
    return read_lag(bootstrap, readers, timeout, security)
