"""Broker and topic settings that `ensure_topics` applies beyond creating the topics.

* The record size limit: a topic created before the limit was set (or by someone else) keeps the
  broker's default `max.message.bytes` (1048588 on noida-db and Kafka); it is raised to
  MAX_MESSAGE_BYTES so that every record the publisher makes fits.
* Partitions: a topic made with fewer partitions than the registry now gives it (telemetry.flows went from
  4 to 6) is grown to that count. Growing moves a node's later records to another partition, so their order
  with the earlier ones is not kept. A topic that holds stream state by partition (changelogs, repartition
  topics, the inputs of node-keyed detectors) is never grown: start-up stops and says so.
* Byte caps: the topics the actuators and the allocator read keep at most `retention.bytes` per partition
  (schemas/topics.py, CONTROL_RETENTION_BYTES); a topic made before the cap gets it.
* Topic auto-creation: a broker that creates any topic a client names turns a typo'd topic into a
  silent sink for records. On the embedded broker, which clocktower owns, `auto.create.topics.enable`
  is turned off (noida-db takes it as a dynamic broker config and keeps it across restarts). An
  external cluster's broker settings are left to its operators; the publisher refuses unknown topics
  and never asks for auto-creation.
"""

from __future__ import annotations

import logging
from collections.abc import Collection

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewPartitions

from clocktower.runtime.errors import UserError
from clocktower.schemas.topics import MAX_MESSAGE_BYTES

log = logging.getLogger(__name__)


def _set(resource: str, name: str, key: str, value: str) -> ConfigResource:
    return ConfigResource(resource, name, incremental_configs=[
        ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET)])


def disable_auto_create(admin: AdminClient, timeout: float) -> None:
    """Turn off `auto.create.topics.enable` on every broker of the cluster; raise if a broker refuses."""
    brokers = admin.list_topics(timeout=timeout).brokers
    futures = admin.incremental_alter_configs(
        [_set("broker", str(b), "auto.create.topics.enable", "false") for b in brokers], request_timeout=timeout)
    for fut in futures.values():
        fut.result(timeout)


def raise_record_limit(admin: AdminClient, topics: list[str], timeout: float) -> list[str]:
    """Raise `max.message.bytes` of `topics` to MAX_MESSAGE_BYTES where lower; returns the topics raised.

    A broker that does not let us (an external cluster's ACLs) gets a warning, not an error: records
    compress well below the limit, and one that still does not fit is refused and counted by the publisher.
    """
    if not topics:
        return []
    try:
        described = admin.describe_configs([ConfigResource("topic", t) for t in topics], request_timeout=timeout)
        low = [res.name for res, fut in described.items()
               if int(fut.result(timeout)["max.message.bytes"].value) < MAX_MESSAGE_BYTES]
        if low:
            altered = admin.incremental_alter_configs(
                [_set("topic", t, "max.message.bytes", str(MAX_MESSAGE_BYTES)) for t in low], request_timeout=timeout)
            for fut in altered.values():
                fut.result(timeout)
        return low
    except (KafkaException, KeyError, ValueError) as exc:
        log.warning("could not raise max.message.bytes of the topics to %d (%s): records over the broker's limit "
                    "will be refused; ask the cluster's operators to raise it", MAX_MESSAGE_BYTES, exc)
        return []


def cap_bytes(admin: AdminClient, caps: dict[str, dict[str, int]], timeout: float) -> list[str]:
    """Lower each topic's settings in `caps` (name -> {`retention.bytes` or `segment.bytes`: at most}) where they
    are unlimited (-1) or higher; returns the topics changed. A topic made before the cap gets it here; a lower
    value an operator set is left alone. A broker that refuses gets a warning, as above."""
    if not caps:
        return []
    try:
        described = admin.describe_configs([ConfigResource("topic", t) for t in caps], request_timeout=timeout)
        changes: dict[str, dict[str, int]] = {}
        for res, fut in described.items():
            have = fut.result(timeout)
            for key, most in caps[res.name].items():
                now = int(have[key].value)
                if now < 0 or now > most:
                    changes.setdefault(res.name, {})[key] = most
        if changes:
            altered = admin.incremental_alter_configs(
                [ConfigResource("topic", t, incremental_configs=[
                    ConfigEntry(k, str(v), incremental_operation=AlterConfigOpType.SET) for k, v in kv.items()])
                 for t, kv in changes.items()], request_timeout=timeout)
            for fut in altered.values():
                fut.result(timeout)
        return sorted(changes)
    except (KafkaException, KeyError, ValueError) as exc:
        log.warning("could not cap the bytes kept by %s (%s): a flood written there is bounded only by retention.ms "
                    "and the disk", ", ".join(sorted(caps)), exc)
        return []


def raise_partitions(admin: AdminClient, wanted: dict[str, int], timeout: float,
                     fixed: Collection[str] = ()) -> list[str]:
    """Grow each topic of `wanted` (name -> partitions) that has fewer partitions; returns those grown.

    A topic in `fixed` backs stream state by partition (a changelog, a repartition topic, a node-keyed
    processor's input): growing it would move keys to partitions whose state is empty, so it is refused."""
    if not wanted:
        return []
    meta = admin.list_topics(timeout=timeout).topics
    have = {n: len(meta[n].partitions) for n in wanted if n in meta}
    low = {n: p for n, p in wanted.items() if n in have and have[n] < p}
    stuck = sorted(n for n in low if n in fixed)
    if stuck:
        raise UserError(f"topics {', '.join(f'{n} ({have[n]} partitions, wants {low[n]})' for n in stuck)} hold "
                        "stream state by partition; growing them would hide that state. Keep the old count, or "
                        "delete them and the streams' changelogs (the state is then lost) before starting")
    if not low:
        return []
    grown = []
    for name, fut in admin.create_partitions([NewPartitions(n, p) for n, p in low.items()],
                                             request_timeout=timeout).items():
        try:
            fut.result(timeout)
        except KafkaException as exc:   # an external cluster's ACLs: the streams still work, on fewer partitions
            log.warning("could not grow %s to %d partitions (%s); it keeps %d", name, low[name], exc, have[name])
            continue
        log.warning("topic %s grown to %d partitions", name, low[name])
        grown.append(name)
    return grown
