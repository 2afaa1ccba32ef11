"""The agent's actuator hands acks to Kafka and returns only once the broker has acknowledged those records.

The actuator commits a command's offset right after its acks are handed over, so an ack still in a memory queue
would be lost with the process, and the command never read again. Waiting on these records' own delivery (not a
flush of everything the agent publishes) keeps a busy or replaying spool from stalling the actuator. An ack not
acknowledged within the bound raises: the offset is not committed, the consumer starts over, and the command is
read again; it is not applied again (the actuator's on-disk memory refuses it as replayed, with a second ack).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from itertools import groupby

from clocktower.producers.spooling_publisher import SpoolingPublisher
from clocktower.schemas.batch_split import encode_records
from clocktower.schemas.event import Event
from clocktower.schemas.topics import topic_for


class AckNotDelivered(RuntimeError):
    """The broker did not acknowledge the acks in time: their command's offset must not be committed."""


def delivered_publisher(publisher: SpoolingPublisher, timeout_s: float) -> Callable[[list[Event]], None]:
    def publish(events: list[Event]) -> None:
        key = lambda e: (type(e).SCHEMA, e.node)  # noqa: E731
        records = [(topic_for(type(group[0])).name, r) for _, grp in groupby(sorted(events, key=key), key=key)
                   for group in [list(grp)] for r in encode_records(group).records]
        if not records:
            return
        lock, done = threading.Lock(), threading.Event()
        left, errors = [len(records)], []

        def delivered(err: object, _msg: object) -> None:
            with lock:
                if err is not None:
                    errors.append(err)
                left[0] -= 1
                if left[0] == 0:
                    done.set()

        for topic, r in records:   # signed with CLOCKTOWER_NODE_KEY: the streams check acks (an undrain frees a spare)
            publisher.publish_raw(topic, *publisher.signed(topic, r.key, r.value, r.headers), on_delivery=delivered)
        if not done.wait(timeout_s):
            raise AckNotDelivered(f"{left[0]} of {len(records)} ack records not acknowledged within {timeout_s:g} s")
        if errors:
            raise AckNotDelivered(f"ack records refused: {errors[0]}")

    return publish
