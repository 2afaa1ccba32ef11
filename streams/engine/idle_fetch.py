"""Back off after an empty fetch in the stream worker's aiokafka consumers.

The embedded broker (noida-db) answers every fetch at once, ignoring the fetch's max wait, and aiokafka
sends the next fetch as soon as the last one is answered: an idle worker spins at tens of percent of a
core (and the broker with it). `install()` makes each empty fetch response hold its node's next fetch
for `IDLE_FETCH_BACKOFF_S`: a record that arrives while idle waits at most that long. A fetch that
returns records is followed at once, so a busy worker is not slowed.

All partitions on a node share its one fetch at a time, and aiokafka leaves a partition out of the fetch
while its records are still buffered (once they are older than its `prefetch_backoff`, it fetches the
others alone). So the back-off only holds partitions that just came back empty: it is skipped, or ends
early, as soon as another partition of the node waits for a fetch (its buffer was consumed), which is
what keeps a busy partition next to idle ones from stalling.
"""

from __future__ import annotations

import asyncio

import aiokafka.consumer.consumer as aiokafka_consumer
from aiokafka.consumer.fetcher import Fetcher
from aiokafka.structs import TopicPartition

# Bounded so end-to-end latency stays low: an idle worker fetches about 4 times a second per broker. Used with the
# embedded broker (streams/settings.py EMBEDDED_IDLE_FETCH_BACKOFF_MS); a Kafka broker holds an empty fetch itself.
IDLE_FETCH_BACKOFF_S = 0.25


class IdleBackoffFetcher(Fetcher):
    """aiokafka's Fetcher, but a fetch that brought no records keeps its node busy for `idle_backoff_s` more,
    unless another partition of that node is waiting to be fetched."""

    idle_backoff_s = IDLE_FETCH_BACKOFF_S

    def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003 - aiokafka's signature
        # Per node in back-off: the assignment, the partitions that came back empty, the future that ends it.
        self._idle_waits: dict[int, tuple[object, frozenset[TopicPartition], asyncio.Future[None]]] = {}
        super().__init__(*args, **kwargs)

    async def _proc_fetch_request(self, assignment, node_id, request) -> bool:  # noqa: ANN001 - aiokafka's types
        has_records = await super()._proc_fetch_request(assignment, node_id, request)
        task = asyncio.current_task()
        if has_records or self.idle_backoff_s <= 0 or (task and task.cancelling()):
            return has_records
        fetched = frozenset(TopicPartition(topic, p) for topic, parts in request.topics for p, *_ in parts)
        if self._others_wait(assignment, node_id, fetched):
            return False
        # The node stays in flight: no new fetch to it meanwhile. The fetch routine wakes us when a partition
        # of the node needs fetching (_get_actions_per_node). A cancel (close(), a lost assignment) ends it
        # quietly, as aiokafka's own fetch does: close() awaits this task.
        wake: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._idle_waits[node_id] = (assignment, fetched, wake)
        try:
            await asyncio.wait({wake}, timeout=self.idle_backoff_s)
        except asyncio.CancelledError:
            pass
        finally:
            del self._idle_waits[node_id]
        return False

    def _get_actions_per_node(self, assignment):  # noqa: ANN001, ANN202 - aiokafka's types
        """Runs each time the fetch routine wakes (a consume, a seek, a finished fetch, its poll timeout)."""
        for node_id, (waiting_assignment, fetched, wake) in self._idle_waits.items():
            if not wake.done() and self._others_wait(waiting_assignment, node_id, fetched):
                wake.set_result(None)
        return super()._get_actions_per_node(assignment)

    def _others_wait(self, assignment, node_id: int, fetched: frozenset[TopicPartition]) -> bool:  # noqa: ANN001
        """Whether a partition of `node_id` outside `fetched` would be fetched now but for the back-off.

        One without a valid position is not fetched (it awaits an offset reset, which may keep failing): it
        does not end the back-off, or an idle node would spin again; its reset waits at most the back-off."""
        for tp in assignment.tps:
            state = assignment.state_value(tp)
            if tp in fetched or tp in self._records or state.paused or not state.has_valid_position:
                continue
            if self._select_read_replica(tp) == node_id:
                return True
        return False


def install(backoff_s: float = IDLE_FETCH_BACKOFF_S) -> None:
    """Make every AIOKafkaConsumer started from now on (Faust's included) use IdleBackoffFetcher."""
    IdleBackoffFetcher.idle_backoff_s = backoff_s
    aiokafka_consumer.Fetcher = IdleBackoffFetcher
