"""Back off after an empty fetch in the stream worker's aiokafka consumers.

The embedded broker (noida-db) answers every fetch at once, ignoring the fetch's max wait, and aiokafka
sends the next fetch as soon as the last one is answered: an idle worker spins at tens of percent of a
core (and the broker with it). `install()` makes each empty fetch response hold its node's next fetch
for `IDLE_FETCH_BACKOFF_S`: a record that arrives while idle waits at most that long. A fetch that
returns records is followed at once, so a busy worker is not slowed.
"""

from __future__ import annotations

import asyncio
import contextlib

import aiokafka.consumer.consumer as aiokafka_consumer
from aiokafka.consumer.fetcher import Fetcher

# Bounded so end-to-end latency stays low: an idle worker fetches about 4 times a second per broker.
IDLE_FETCH_BACKOFF_S = 0.25


class IdleBackoffFetcher(Fetcher):
    """aiokafka's Fetcher, but a fetch that brought no records keeps its node busy for `idle_backoff_s` more."""

    idle_backoff_s = IDLE_FETCH_BACKOFF_S

    async def _proc_fetch_request(self, assignment, node_id, request) -> bool:  # noqa: ANN001 - aiokafka's types
        has_records = await super()._proc_fetch_request(assignment, node_id, request)
        task = asyncio.current_task()
        if not has_records and self.idle_backoff_s > 0 and not (task and task.cancelling()):
            # The node stays in flight: no new fetch to it meanwhile. A cancel (close(), a lost assignment) ends it
            # quietly, as aiokafka's own fetch does: close() awaits this task.
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(self.idle_backoff_s)
        return has_records


def install(backoff_s: float = IDLE_FETCH_BACKOFF_S) -> None:
    """Make every AIOKafkaConsumer started from now on (Faust's included) use IdleBackoffFetcher."""
    IdleBackoffFetcher.idle_backoff_s = backoff_s
    aiokafka_consumer.Fetcher = IdleBackoffFetcher
