"""How far each consumer group is behind: per topic and partition, the end offset minus the group's committed one.

Read from the broker's committed offsets (no group is joined: nothing of the groups' work is disturbed), as
`clocktower topics` shows them and as the sink and the streams export them (runtime/lag_metrics.py).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from confluent_kafka import Consumer, TopicPartition

from clocktower.schemas.kafka_security import KafkaSecurity
from clocktower.schemas.topics import TOPICS


def consumer_lag(bootstrap: str, readers: Mapping[str, Collection[str]], timeout: float = 10.0,
                 security: KafkaSecurity | None = None) -> list[dict]:
    """Per (group, topic it reads, partition): the low and high watermarks (`start`, `end`), the group's committed
    offset (None: never committed) and its lag, the records it has yet to commit; a partition never committed counts
    from its low watermark, where the group would start."""
    login = (security or KafkaSecurity()).librdkafka()
    consumers = {g: Consumer({"bootstrap.servers": bootstrap, "group.id": g, "enable.auto.commit": False, **login})
                 for g in readers}
    out = []
    try:
        c0 = next(iter(consumers.values()))
        meta = c0.list_topics(timeout=timeout)
        names = dict.fromkeys([t.name for t in TOPICS] + [n for topics in readers.values() for n in topics])
        for name in names:
            tmeta = meta.topics.get(name)
            groups = [g for g, topics in readers.items() if name in topics]
            if tmeta is None or tmeta.error is not None or not groups:
                continue
            tps = [TopicPartition(name, p) for p in sorted(tmeta.partitions)]
            marks = [c0.get_watermark_offsets(tp, timeout=timeout) for tp in tps]
            for g in groups:
                committed = [c.offset if c.offset >= 0 else None
                             for c in consumers[g].committed(tps, timeout=timeout)]
                out.extend({"group": g, "topic": name, "partition": tp.partition, "start": low, "end": high,
                            "committed": off, "lag": max(high - (low if off is None else off), 0)}
                           for tp, (low, high), off in zip(tps, marks, committed, strict=True))
    finally:
        for c in consumers.values():
            c.close()
    return sorted(out, key=lambda r: (r["group"], r["topic"], r["partition"]))
