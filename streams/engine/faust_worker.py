"""What a stream worker adds to its Faust app: a table per durable processor, an agent per topic it reads, the
commit barrier, and its timers.

Each agent decodes and routes a record through the same RecordHandler and Topology as the in-memory pipeline
(streams/processors.py); this module only speaks to Faust and aiokafka. State changes wait in each store, and
regrouped events in the topology, until a commit writes and sends them (streams/engine/write_back.py) or, for
regrouped events, until CLOCKTOWER_STREAMS_REGROUP_LINGER_MS has passed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from functools import partial

import faust

from clocktower.control.issuer import CommandIssuer
from clocktower.schemas.ids import bounded_name
from clocktower.schemas.operations import StreamsTick
from clocktower.streams.clock_broadcast import ClockBroadcast
from clocktower.streams.commit_stall import CHECK_S, CommitStall
from clocktower.streams.emit import Out, records
from clocktower.streams.engine.changelog_batches import ChangelogBatches
from clocktower.streams.engine.commit_barrier import CommitBarrier
from clocktower.streams.engine.group_join import end_for_restart
from clocktower.streams.engine.offset_watchdog import positions_and_commits
from clocktower.streams.engine.ordered_sends import OrderedSends
from clocktower.streams.engine.table_backing import TableBacking
from clocktower.streams.engine.write_back import WriteBackOnCommit
from clocktower.streams.event_failure import EventFailure
from clocktower.streams.handled_audit import HandledAudit
from clocktower.streams.node_signed_outputs import OutputSigner
from clocktower.streams.processor import Processor
from clocktower.streams.record_handler import IdentityCheck
from clocktower.streams.registry import partitions
from clocktower.streams.remediation_budget import RemediationBudget
from clocktower.streams.settings import StreamsSettings
from clocktower.streams.table_memory import table_options
from clocktower.streams.topology import Topology, record_handlers

log = logging.getLogger(__name__)
CHANGELOG_BUFFER = 10_000
DUE_CHECK_S = 0.25   # how often partitions with work waiting on the clock are ticked (Processor.due_partitions)


class FaustWorker:
    def __init__(self, app: faust.App, settings: StreamsSettings, instance_id: str, processors: Sequence[Processor],
                 issuer: CommandIssuer, budget: RemediationBudget, identity: IdentityCheck | None,
                 sign_outputs: OutputSigner | None, clocks: ClockBroadcast) -> None:
        self.app, self.settings, self.instance_id, self.clocks = app, settings, instance_id, clocks
        self.sign_outputs = sign_outputs
        self.tables = {p.name: app.Table(p.name, partitions=partitions(type(p)), key_type=bytes, value_type=bytes,
                                         options=table_options())   # RocksDB memory bounded (streams/table_memory.py)
                       for p in processors if p.durable}   # bytes in, bytes out: the processors encode their own state
        self.barrier = CommitBarrier(app, on_failure=self._send_failed)
        self.changelog = ChangelogBatches(self.barrier)   # what every offset commit waits for
        self.regroup_linger_s = settings.streams_regroup_linger_ms / 1000
        self.topology = Topology(processors, issuer, budget, self._table, settings.streams_max_entries,
                                 write_back=True, regroup_linger_s=self.regroup_linger_s)
        self.regrouped = OrderedSends(self.barrier, self._send)   # regrouped and timer records, behind the barrier
        app.sensors.add(WriteBackOnCommit(self._before_commit))
        self.handlers = record_handlers(self.topology, identity,
                                        settings.max_future_skew_ns,   # CLOCKTOWER_MAX_FUTURE_SKEW_S
                                        sign_outputs)
        self.audit = HandledAudit(settings.streams_audit_dir, instance_id) if settings.streams_audit_dir else None
        self.reload = True   # rebuild the stores' expiry indexes after each rebalance, once the tables are recovered
        self.recovered = False   # the tables of the current assignment are recovered (Faust's on_rebalance_complete)
        self.commit_stall = CommitStall()
        self.processed: dict[tuple[str, int], int] = {}   # per partition, the last record whose outputs were all sent
        app.on_partitions_revoked.connect(self._revoked)
        app.on_partitions_assigned.connect(self._assigned)
        app.on_rebalance_complete.connect(self._recovered)
        app.task(self._start)
        app.timer(CHECK_S)(self._check_commits)
        if self.regroup_linger_s > 0:
            app.timer(self.regroup_linger_s)(self._regrouped_due)
        app.timer(settings.streams_tick_s)(self._tick)
        app.timer(DUE_CHECK_S)(self._due)
        for name in self.handlers:
            self._agent_for(name)

    def _send_failed(self, exc: BaseException) -> None:
        """A send behind the barrier failed: no later commit passes it (the failure is kept), and the worker ends
        now. Sends cancelled while the worker stops are only logged: the kept failure blocks any commit after them."""
        if isinstance(exc, asyncio.CancelledError) and self.app.should_stop:
            log.warning("sends still waiting were cancelled by the stop; their records are read again")
            return
        end_for_restart(f"a record or changelog batch was not sent ({exc!r})")

    def _table(self, p: Processor) -> TableBacking:
        return TableBacking(self.tables[p.name], self.changelog,
                            on_failure=lambda exc: end_for_restart(f"state of {p.name} not written ({exc!r})"))

    def _before_commit(self) -> int:
        """Sends what regrouped events wait and writes the pending state, behind the commit barrier. Any failure
        ends the worker at once: a commit after it could pass over records whose state or outputs were lost."""
        try:
            outs = self.topology.drain_regrouped()
            self.regrouped.put(outs)
            return self.topology.write_pending() + len(outs)
        except Exception as exc:  # noqa: BLE001 - ends the worker; its restart reads the uncommitted records again
            log.exception("writing the state before a commit failed")
            end_for_restart(f"state not written before a commit ({exc!r})")
            raise

    async def _revoked(self, sender: object, *args: object, **kwargs: object) -> None:
        dropped = self.topology.drop_pending()   # its records were not committed: read again by the partitions' owners
        if dropped:
            log.info("partitions revoked: %d pending state entries dropped, their records are read again", dropped)

    async def _assigned(self, sender: object, *args: object, **kwargs: object) -> None:
        self.reload, self.recovered = True, False

    async def _recovered(self, sender: object, *args: object, **kwargs: object) -> None:
        self.recovered = True   # (sent by Faust's recovery once the tables are recovered, before the streams resume)

    async def _start(self) -> None:
        self.clocks.start()
        # Faust stops every agent whenever 100 records wait in its send_soon buffer, and drains them one by one.
        # The tables no longer feed it (their changelog goes in batches: streams/engine/changelog_batches.py); the
        # larger bound stays for whatever else of Faust's uses it, flushed before every offset commit all the same.
        self.app.producer.buffer.max_messages = CHANGELOG_BUFFER

    async def _check_commits(self) -> None:
        """A partition fetched ahead of its committed offset, neither moving, ends the worker for a restart
        (streams/commit_stall.py). The offsets are aiokafka's position and the broker's commit, not Faust's. Not
        counted during a rebalance: records fetched before it wait for the seek at its end, however long recovery
        takes."""
        app = self.app
        if app.rebalancing:   # (a rebalance that never ends is not seen here: recovering a big table may take long)
            self.commit_stall = CommitStall()   # counts start again after it: positions are sought anew
            return
        try:
            thread = app.consumer._thread
            offsets = await asyncio.wait_for(thread.call_thread(positions_and_commits, thread._ensure_consumer(),
                                                                app.topics.acks_enabled_for), CHECK_S)
        except Exception:  # noqa: BLE001 - a check that fails (consumer not started, a rebalance) must not stop it
            log.warning("commit stall check skipped", exc_info=True)   # (a timeout too: the consumer thread is busy)
            return
        stall = self.commit_stall
        stalled = stall.check({tp: (pos, committed, self.processed.get((tp.topic, tp.partition)))
                               for tp, (pos, committed) in offsets.items()})
        for tp, (state, checks) in stall.counting().items():
            if checks >= 3:   # what the next session needs to see a stall coming (issue 17)
                log.warning("%s:%d fetched ahead of its commit, nothing moving for %d checks (position, committed, "
                            "processed: %s)", tp.topic, tp.partition, checks, state)
        if stalled:
            counted = stall.counting()
            where = sorted(f"{tp.topic}:{tp.partition} (position, committed, processed {counted[tp][0]}, "
                           f"{counted[tp][1]} checks)" for tp in stalled)
            end_for_restart(f"partitions fetched ahead of their committed offset, no offset moving: {where}; "
                            "its restart handles them again")

    async def _regrouped_due(self) -> None:
        """Regrouped events that waited their linger go out even when no record comes to take them along."""
        self.regrouped.put(self.topology.regrouped_ready())

    async def _due(self) -> None:
        """Ticks the partitions whose processors have work waiting on this worker's clock (the flow join's segments
        held for their clock estimates), so it goes out even when no record comes. Not between an assignment and the
        stores' reload, which it does itself once the tables are recovered (so held segments recovered from a dead
        worker's table come out even when no record follows); not gated on Faust's `rebalancing` flag, which stayed
        set on a restarted worker whose seek failed (measured in test_scale_out: its held segments never came out).
        A revoke empties what is due. The records are handed over at once, in order, behind the commit barrier
        (engine/ordered_sends.py): a commit that writes their state waits for them, and no await comes between."""
        if self.reload:
            if not self.recovered:
                return
            self.topology.reload()
            self.reload = False
        failures: list[EventFailure] = []
        outs = list(records(self.topology.tick_due(failures)))
        for f in failures:
            log.error("a timer tick of a processor failed; it is tried again at the next one", exc_info=f.error)
        if self.sign_outputs is not None:
            outs = [self.sign_outputs(o) for o in outs]
        self.regrouped.put(outs)

    async def _tick(self) -> None:
        """This worker's tick on control.ticks: the allocator, wherever it runs, re-checks the requests its budget
        withheld even when no request or ack comes (schemas/operations.py StreamsTick)."""
        try:
            for out in records([StreamsTick(node=bounded_name(self.instance_id), ts_ns=time.time_ns())]):
                if self.sign_outputs is not None:
                    out = self.sign_outputs(out)   # in this worker's name: with a key, unsigned ticks are dead letters
                await self._send(out, critical=False)
        except Exception:  # noqa: BLE001 - a timer that raises would end the worker (mode crashes the app): next tick
            log.warning("this worker's tick on control.ticks was not sent; the next one is due in %.0f s",
                        self.settings.streams_tick_s, exc_info=True)

    async def _send(self, out: Out, critical: bool = True) -> None:
        """Hand a record to the producer: aiokafka's own send, not Faust's topic layers (a third of the cost of a
        send, issue 19); every offset commit waits for what was handed (Faust flushes the producer first). A record
        the producer refuses or the broker never takes ends the worker at once (its restart reads the record's input
        again): Faust would ack the record and let a later commit pass it. `critical` False (a tick): only logged."""
        try:
            delivery = await self.app.producer.send(out.topic, out.key, out.value, out.partition, None, out.headers)
        except Exception as exc:  # noqa: BLE001 - see above
            if not critical:
                raise
            end_for_restart(f"a record for {out.topic} was not handed to the producer ({exc!r})")
            raise
        delivery.add_done_callback(partial(_delivered, out.topic, critical))

    async def _process(self, name: str, stream: faust.StreamT) -> None:
        handler, topology, audit = self.handlers[name], self.topology, self.audit
        async for event in stream.events():
            if self.reload:
                topology.reload()
                self.reload = False
            msg = event.message
            headers = list(msg.headers or ())   # the record's own list: Faust's event.headers is a dict
            outs = handler.handle(name, msg.partition, msg.offset, event.key, event.value, headers)
            self.regrouped.put(topology.regrouped_ready())   # at once, before any await (engine/ordered_sends.py)
            if audit is not None:
                audit.record(name, msg.partition, msg.offset)
            for out in outs:
                await self._send(out)
            self.processed[(name, msg.partition)] = msg.offset   # acked as soon as the agent asks for the next record

    def _agent_for(self, name: str) -> None:
        async def agent(stream: faust.StreamT) -> None:
            await self._process(name, stream)

        agent.__name__ = "agent_" + name.replace(".", "_").replace("-", "_")
        topic = self.app.topic(name, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")
        self.app.agent(topic, name=agent.__name__)(agent)


def _delivered(topic: str, critical: bool, delivery: asyncio.Future) -> None:
    exc = asyncio.CancelledError() if delivery.cancelled() else delivery.exception()
    if exc is None:
        return
    if not critical:
        log.warning("a record for %s was not sent: %r", topic, exc)
        return
    end_for_restart(f"a record for {topic} was not sent ({exc!r})")   # even while stopping: no commit after it

