"""The one router: where each processor runs, on its input topic or behind its repartition topic.

The Faust app (streams/engine/faust_worker.py) and the in-memory pipeline (streams/processors.py) both route
every batch through `Topology.step`; the app publishes what it returns, the in-memory pipeline feeds it back.

A node-keyed processor runs on its input records' partition. Any other reads its input through its
repartition topic: the record of an input topic is split by the processor's partition key, each part
goes to the partition `partition_of(key)` names, and the processor runs on the records of that topic.
Then every event one piece of state needs is on one partition, owned by one worker, whose table
(and its changelog partition) holds that state.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, MutableMapping, Sequence
from typing import NamedTuple

from clocktower.control.issuer import CommandIssuer
from clocktower.schemas.event import Event
from clocktower.schemas.topics import BY_MODEL, NODE_SIGNED_TOPICS
from clocktower.streams.emit import Out, records
from clocktower.streams.event_failure import EventFailure
from clocktower.streams.node_signed_outputs import SIGNED_TOPICS, OutputSigner
from clocktower.streams.processor import Processor, partition_of
from clocktower.streams.processor_runner import ProcessorRunner
from clocktower.streams.record_handler import IdentityCheck, RecordHandler
from clocktower.streams.registry import input_topics, partitions, repartition_topic, repartitions
from clocktower.streams.regroup_buffer import Part, RegroupBuffer
from clocktower.streams.remediation_budget import RemediationBudget
from clocktower.streams.state_store import DEFAULT_MAX_ENTRIES, StateStore

Backing = Callable[[Processor], MutableMapping[bytes, bytes] | None]


class Routed(NamedTuple):
    derived: list[Event]   # to publish on their own topics
    parts: list[Part]      # (repartition topic, partition, events) for the processors behind it
    part_at: list[list[int]]   # for each part, its events' indexes in the batch


class Topology:
    def __init__(self, processors: Sequence[Processor], issuer: CommandIssuer, budget: RemediationBudget,
                 backing: Backing, max_entries: int = DEFAULT_MAX_ENTRIES, write_back: bool = False,
                 regroup_linger_s: float = 0.0) -> None:
        """`max_entries`: the state each processor keeps per partition (CLOCKTOWER_STREAMS_MAX_ENTRIES).
        `write_back`: state changes wait for `write_pending` (before each commit) instead of being written per batch.
        `regroup_linger_s` > 0: regrouped events wait up to that long to share records (streams/regroup_buffer.py)."""
        self.budget = budget
        self.regroup = RegroupBuffer(regroup_linger_s) if regroup_linger_s > 0 else None
        self._full: list[Part] = []   # parts the buffer let go when full, until `regrouped_ready` takes them
        self.runners: list[ProcessorRunner] = []
        for p in processors:
            store = StateStore(p, backing(p) if p.durable else None, max_entries, write_back=write_back and p.durable)
            self.runners.append(ProcessorRunner(p, store, issuer))
        self._index()

    def _index(self) -> None:
        self._direct: dict[str, list[ProcessorRunner]] = defaultdict(list)      # input topic -> runners
        self._regroup: dict[str, list[ProcessorRunner]] = defaultdict(list)     # input topic -> runners
        self._behind: dict[str, ProcessorRunner] = {}                          # repartition topic -> runner
        for runner in self.runners:
            cls = type(runner.processor)
            for model in cls.consumes:
                (self._regroup if repartitions(cls) else self._direct)[BY_MODEL[model].name].append(runner)
            if repartitions(cls):
                self._behind[repartition_topic(cls)] = runner

    def replace(self, processor: Processor) -> None:
        """Run `processor` in place of the registered one of its name, on a new in-memory store (the in-memory
        pipeline's tests inject faulty ones). Refused where state is written back to a table: it would be lost."""
        at = [i for i, r in enumerate(self.runners) if r.processor.name == processor.name]
        if not at:
            raise KeyError(f"no processor named {processor.name!r}")
        i, old = at[0], self.runners[at[0]]
        if old.store.write_back:
            raise ValueError(f"{processor.name}: its state is written back to a table; replace is for the in-memory "
                             "pipeline")
        self.runners[i] = ProcessorRunner(processor, StateStore(processor, None, old.store.max_entries), old.issuer)
        self._index()

    def reads(self, topic: str) -> bool:
        """Whether any processor reads `topic` (an input topic or a repartition topic)."""
        return topic in self._direct or topic in self._regroup or topic in self._behind

    @property
    def repartition_topics(self) -> list[str]:
        return list(self._behind)

    def reload(self) -> None:
        """After a rebalance: rebuild each store's expiry index from its recovered table."""
        for r in self.runners:
            if r.processor.durable:
                r.store.reload()

    def write_pending(self) -> int:
        """Write every store's pending state (before a commit); how many entries."""
        return sum(r.store.write_pending() for r in self.runners if r.store.write_back)

    def drop_pending(self) -> int:
        """Forget every store's pending state and every regrouped event waiting (partitions revoked: their records
        are read again), and tell every processor (Processor.revoked: what it tracks for `due_partitions`)."""
        dropped = sum(len(evs) for _, _, evs in self._full)
        self._full.clear()
        for r in self.runners:
            r.processor.revoked()
        dropped += self.regroup.drop() if self.regroup is not None else 0
        return dropped + sum(r.store.drop_pending() for r in self.runners if r.store.write_back)

    def tick_due(self, failures: list[EventFailure] | None) -> list[Event]:
        """The outputs of ticking every partition whose processor has work waiting on the worker's clock
        (Processor.due_partitions), when no record comes to tick it. `failures` None: a tick that raises raises."""
        out: list[Event] = []
        for runner in self.runners:
            for partition in sorted(runner.processor.due_partitions()):
                out += runner.run(partition, [], failures)
        return out

    def regrouped_ready(self) -> list[Out]:
        """The records of regrouped events that are ready: parts that filled up, and parts that have waited long
        enough. With a regroup buffer, `route` returns none of these: hand them to the sender at once."""
        return self._take(RegroupBuffer.due)

    def drain_regrouped(self) -> list[Out]:
        """The records of every regrouped event waiting (before a commit)."""
        return self._take(RegroupBuffer.drain)

    def _take(self, take: Callable[[RegroupBuffer], list[Part]]) -> list[Out]:
        if self.regroup is None:
            return []
        parts, self._full = self._full + take(self.regroup), []
        return _part_records(parts)

    def step(self, topic: str, partition: int, events: Sequence[Event], failures: list[EventFailure] | None,
             offset: int | None = None) -> Routed:
        """What one batch of `topic` makes: the derived events of the processors that read it there, and its events
        regrouped for the processors behind a repartition topic. `failures` None: an event that raises raises."""
        record = None if offset is None else (topic, partition, offset)
        runner = self._behind.get(topic)
        if runner is not None:
            return Routed(runner.run(partition, events, failures, record), [], [])
        derived: list[Event] = []
        for runner in self._direct.get(topic, ()):
            derived += runner.run(partition, events, failures, record)
        parts: list[Part] = []
        part_at: list[list[int]] = []
        for runner in self._regroup.get(topic, ()):
            for part, at in self._regrouped(runner.processor, events, failures):
                parts.append(part)
                part_at.append(at)
        return Routed(derived, parts, part_at)

    def route(self, topic: str, partition: int, events: Sequence[Event], failures: list[EventFailure],
              offset: int | None = None) -> list[Out]:
        """The records one batch makes: derived events to their topics, regrouped ones to the repartition topics
        (or, with a regroup buffer, to the buffer: `regrouped_ready` hands them on)."""
        derived, parts, _ = self.step(topic, partition, events, failures, offset)
        out = list(records(derived))
        if self.regroup is None:
            out += _part_records(parts)
        else:
            self._full += [full for part in parts for full in self.regroup.add(*part)]
        return out

    @staticmethod
    def _regrouped(p: Processor, events: Sequence[Event],
                   failures: list[EventFailure] | None) -> list[tuple[Part, list[int]]]:
        """Each part of `events` for `p`'s repartition topic, with its events' indexes in `events`."""
        n = partitions(type(p))
        parts: dict[int, list[Event]] = defaultdict(list)
        at: dict[int, list[int]] = defaultdict(list)
        for i, e in enumerate(events):
            if isinstance(e, p.consumes):
                try:
                    part = partition_of(p.partition_key(e), n)
                    parts[part].append(e)
                    at[part].append(i)
                except Exception as exc:  # noqa: BLE001 - the record is dead-lettered, the others go on
                    if failures is None:
                        raise
                    failures.append(EventFailure(i, exc))
        topic = repartition_topic(type(p))
        return [((topic, part, evs), at[part]) for part, evs in sorted(parts.items())]


def _part_records(parts: list[Part]) -> list[Out]:
    return [o for topic, partition, evs in parts
            for o in records(evs, topic=topic, partition=partition, regrouped=True)]


def record_handlers(topology: Topology, identity: IdentityCheck | None, max_future_skew_ns: int,
                    sign_outputs: OutputSigner | None = None) -> dict[str, RecordHandler]:
    """The handler of every topic the streams read. Producer identity (CLOCKTOWER_PRODUCER_KEY) is checked on
    what nodes publish (telemetry.*, and control.acks: an applied undrain frees a spare) and on what the streams
    publish in a node's or a worker's name and sign with its key (control.replacements, control.ticks:
    streams/node_signed_outputs.py), not
    on what else the streams publish and read back (analytics.clock_edges, the repartition topics): nodes do not
    sign those, and only the streams' Kafka principal may write them (ACLs)."""
    checked = NODE_SIGNED_TOPICS
    assert checked >= SIGNED_TOPICS
    out = {name: RecordHandler(topology, identity=identity if name in checked else None,
                               max_future_skew_ns=max_future_skew_ns, sign_outputs=sign_outputs)
           for name in input_topics()}
    out.update({name: RecordHandler(topology, max_future_skew_ns=max_future_skew_ns, internal=True,
                                    sign_outputs=sign_outputs)
                for name in topology.repartition_topics})
    return out
