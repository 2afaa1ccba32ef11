"""Read, for the commit-stall check, what the consumer and the broker hold, never what Faust thinks they hold.

Per assigned partition of the topics the worker acks: aiokafka's position, read on the consumer's own thread, and
the committed offset fetched from the group coordinator (the broker), or the partition's log start where nothing
was committed. streams/commit_stall.py decides from these; streams/engine/faust_worker.py runs it every CHECK_S.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition

from clocktower.streams.engine.faust_fixes import position

BROKER_TIMEOUT_S = 8.0   # one check's broker requests: a check that cannot finish is skipped, not queued


async def positions_and_commits(consumer: AIOKafkaConsumer, acked: Callable[[str], bool]
                                ) -> dict[TopicPartition, tuple[int | None, int | None]]:
    """Per assigned partition of an acked topic: (position, committed offset or log start). Runs on the consumer's
    thread (Faust's call_thread)."""
    tps = [tp for tp in consumer.assignment() if acked(tp.topic)]
    if not tps:
        return {}
    committed = await asyncio.wait_for(consumer._coordinator.fetch_committed_offsets(tps), BROKER_TIMEOUT_S)
    out: dict[TopicPartition, int | None] = {tp: meta.offset for tp, meta in committed.items() if meta.offset >= 0}
    never = [tp for tp in tps if tp not in out]
    if never:
        out.update(await asyncio.wait_for(consumer.beginning_offsets(never), BROKER_TIMEOUT_S))
    return {tp: (position(consumer, tp), out.get(tp)) for tp in tps}
