"""Create the registry's topics and read their offsets."""

from __future__ import annotations

from collections.abc import Collection, Mapping

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from clocktower import topic_config
from clocktower.schemas.kafka_security import KafkaSecurity
from clocktower.schemas.topics import TOPICS
from clocktower.streams.inputs import INPUT_TOPICS


def ensure_topics(bootstrap: str, timeout: float = 15.0, security: KafkaSecurity | None = None,
                  disable_auto_create: bool = False) -> list[str]:
    """Create every missing registry topic, raise existing ones' record size limit; returns the names created.

    `disable_auto_create` (the embedded broker only) turns the broker's topic auto-creation off first."""
    # log_level 4: warnings and errors only (librdkafka's info lines, e.g. BGQUEUE on close, are not for users)
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 4, **(security or KafkaSecurity()).librdkafka()})
    if disable_auto_create:
        topic_config.disable_auto_create(admin, timeout)
    existing = set(admin.list_topics(timeout=timeout).topics)
    topic_config.raise_record_limit(admin, [t.name for t in TOPICS if t.name in existing], timeout)
    new = [NewTopic(t.name, num_partitions=t.partitions, replication_factor=1, config=t.config)
           for t in TOPICS if t.name not in existing]
    created = []
    for name, fut in (admin.create_topics(new, request_timeout=timeout).items() if new else ()):
        try:
            fut.result(timeout)
            created.append(name)
        except KafkaException as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise
    return created


# Who reads what: the sink stores every topic; the streams read the telemetry they analyse (streams/inputs.py).
READERS: dict[str, tuple[str, ...]] = {
    "clocktower-sink": tuple(t.name for t in TOPICS),
    "clocktower-streams": INPUT_TOPICS,
}


def consumer_lag(bootstrap: str, readers: Mapping[str, Collection[str]] = READERS, timeout: float = 10.0,
                 security: KafkaSecurity | None = None) -> list[dict]:
    """Per (group, topic it reads, partition): the high watermark, the group's committed offset (None: never
    committed) and its lag, the records it has yet to commit; a partition never committed counts from its low
    watermark, where the group would start."""
    login = (security or KafkaSecurity()).librdkafka()
    consumers = {g: Consumer({"bootstrap.servers": bootstrap, "group.id": g, "enable.auto.commit": False, **login})
                 for g in readers}
    out = []
    try:
        c0 = next(iter(consumers.values()))
        meta = c0.list_topics(timeout=timeout)
        for spec in TOPICS:
            tmeta = meta.topics.get(spec.name)
            groups = [g for g, topics in readers.items() if spec.name in topics]
            if tmeta is None or tmeta.error is not None or not groups:
                continue
            tps = [TopicPartition(spec.name, p) for p in sorted(tmeta.partitions)]
            marks = [c0.get_watermark_offsets(tp, timeout=timeout) for tp in tps]
            for g in groups:
                committed = [c.offset if c.offset >= 0 else None
                             for c in consumers[g].committed(tps, timeout=timeout)]
                out.extend({"group": g, "topic": spec.name, "partition": tp.partition, "end": high,
                            "committed": off, "lag": max(high - (low if off is None else off), 0)}
                           for tp, (low, high), off in zip(tps, marks, committed, strict=True))
    finally:
        for c in consumers.values():
            c.close()
    return sorted(out, key=lambda r: (r["group"], r["topic"], r["partition"]))
