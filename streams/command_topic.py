"""How many partitions control.commands really has: the streams route each command by it, as the actuators do."""

from __future__ import annotations

import logging

from confluent_kafka.admin import AdminClient

from clocktower.schemas.control import ControlCommand
from clocktower.schemas.topics import BY_MODEL

log = logging.getLogger(__name__)


def command_partitions(bootstrap: str, login: dict[str, str], timeout_s: float = 10.0) -> int:
    """The topic's partition count from the broker; the registry's count when the broker does not say (logged)."""
    spec = BY_MODEL[ControlCommand]
    try:
        # every topic, not this one by name: a named metadata request makes a broker with auto-create on create it,
        # with its default partition count
        admin = AdminClient({"bootstrap.servers": bootstrap, "logger": log, **login})   # librdkafka's lines: logging
        meta = admin.list_topics(timeout=timeout_s)
        topic = meta.topics.get(spec.name)
        if topic is not None and topic.error is None and topic.partitions:
            if len(topic.partitions) != spec.partitions:
                log.warning("%s has %d partitions (the registry says %d): commands follow the topic", spec.name,
                            len(topic.partitions), spec.partitions)
            return len(topic.partitions)
        log.warning("%s is not on the broker yet: commands are routed by the registry's %d partitions", spec.name,
                    spec.partitions)
    except Exception as exc:  # noqa: BLE001 - no answer: the registry's count, said once
        log.warning("could not read %s's partitions (%s): routing by the registry's %d", spec.name, exc,
                    spec.partitions)
    return spec.partitions
