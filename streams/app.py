"""The Faust app: thin agents that decode records and publish what the processors derive.

Run it with `python -m clocktower.streams` (clocktower starts it for you); run more with distinct
CLOCKTOWER_STREAMS_INSTANCE_ID values to spread the partitions. Which processor runs where is decided in
streams/topology.py from the registry (streams/registry.py); what happens to each record, bad ones
included, in streams/record_handler.py. State is in Faust tables on the rocksdict store, each with a
changelog topic, so a worker that restarts or takes over partitions recovers it.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from functools import partial

import faust

from clocktower.control.issuer import CommandIssuer
from clocktower.control.key_files import signer_from
from clocktower.schemas.ids import bounded_name
from clocktower.schemas.kafka_security import KafkaSecurity
from clocktower.schemas.operations import StreamsTick
from clocktower.schemas.record_mac import NodeSigning
from clocktower.schemas.topics import MAX_MESSAGE_BYTES
from clocktower.streams.clock_broadcast import ClockBroadcast
from clocktower.streams.command_topic import command_partitions
from clocktower.streams.commit_stall import CHECK_S, CommitStall
from clocktower.streams.emit import Out, records, use_command_partitions
from clocktower.streams.engine.changelog_batches import ChangelogBatches
from clocktower.streams.engine.commit_barrier import CommitBarrier
from clocktower.streams.engine.ordered_sends import OrderedSends
from clocktower.streams.engine.table_backing import TableBacking
from clocktower.streams.engine.write_back import WriteBackOnCommit
from clocktower.streams.faust_fixes import install as install_faust_fixes
from clocktower.streams.group_join import end_for_restart
from clocktower.streams.group_join import install as install_group_join_guard
from clocktower.streams.handled_audit import HandledAudit
from clocktower.streams.idle_fetch import install as install_idle_fetch_backoff
from clocktower.streams.kafka_credentials import faust_credentials
from clocktower.streams.node_signed_outputs import output_signer
from clocktower.streams.offset_watchdog import positions_and_commits
from clocktower.streams.processor import Processor
from clocktower.streams.processor_context import context_from_settings
from clocktower.streams.quiet_worker import QuietWorker
from clocktower.streams.record_handler import identity_check
from clocktower.streams.registry import APP_ID, build, partitions
from clocktower.streams.remediation_budget import RemediationBudget
from clocktower.streams.settings import StreamsSettings
from clocktower.streams.table_memory import table_options
from clocktower.streams.topology import Topology, record_handlers

log = logging.getLogger(__name__)
settings = StreamsSettings()
signer = signer_from(settings)   # first: without a key the worker stops here, before touching the network
install_idle_fetch_backoff(settings.idle_fetch_backoff_s)   # 0 but with CLOCKTOWER_BROKER_PROFILE=embedded
# a dead group coordinator ends the worker for a restart; with the embedded broker an empty assignment rejoins
install_group_join_guard(rejoin_on_empty=settings.workarounds.rejoin_on_empty_assignment)
install_faust_fixes()        # records Faust discards in a rebalance are read again (streams/faust_fixes.py)
instance_id = settings.streams_instance_id or f"{APP_ID}-{socket.gethostname()}"
security = KafkaSecurity()

app = faust.App(
    APP_ID,
    broker=f"kafka://{settings.bootstrap}",
    broker_credentials=faust_credentials(security),   # CLOCKTOWER_KAFKA_* SASL/mTLS
    store="rocksdb://",              # rocksdict (the python-rocksdb binding is not installed)
    datadir=str(settings.data_dir / "streams" / instance_id),   # one per worker: a store is one process's
    table_standby_replicas=0,
    web_enabled=False,
    web_bind="127.0.0.1",
    topic_disable_leader=True,
    topic_allow_declare=False,       # the topic setup creates every topic, internal ones included
    consumer_auto_offset_reset="earliest",
    broker_session_timeout=10.0,
    # Static membership: a worker restarted after a crash takes its partitions back at once
    # (noida-db never completes the rebalance that would otherwise wait for the dead member).
    consumer_group_instance_id=instance_id,
    producer_acks=-1,
    stream_wait_empty=True,    # a rebalance waits for the events in flight: none is dropped, so no gap holds commits
    producer_compression_type="lz4",
    producer_max_request_size=MAX_MESSAGE_BYTES,   # records up to the topics' limit (Faust's default: 1,000,000)
    Worker=QuietWorker,        # no spinner: Faust's sets the root logger to DEBUG (streams/quiet_worker.py)
)
clocks = ClockBroadcast(settings.bootstrap, {**security.librdkafka(), **settings.workarounds.librdkafka_consumer()})
use_command_partitions(command_partitions(settings.bootstrap, security.librdkafka()))
budget = RemediationBudget(settings.remediation_max_per_hour)
processors = build(context_from_settings(settings, clocks=clocks, remediation_budget=budget,
                                         approval_verifier=signer.verifier()))
tables = {p.name: app.Table(p.name, partitions=partitions(type(p)), key_type=bytes, value_type=bytes,
                            options=table_options())   # RocksDB memory bounded (streams/table_memory.py)
          for p in processors if p.durable}   # bytes in, bytes out: the processors encode their own state


def _send_failed(exc: BaseException) -> None:
    """A send behind the barrier failed: no later commit passes it (the failure is kept), and the worker ends now.
    Sends cancelled while the worker stops are only logged: the kept failure blocks any commit after them."""
    if isinstance(exc, asyncio.CancelledError) and app.should_stop:
        log.warning("sends still waiting were cancelled by the stop; their records are read again")
        return
    end_for_restart(f"a record or changelog batch was not sent ({exc!r})")


barrier = CommitBarrier(app, on_failure=_send_failed)
changelog = ChangelogBatches(barrier)   # what every offset commit waits for (streams/engine/commit_barrier.py)


def _table(p: Processor) -> TableBacking:
    return TableBacking(tables[p.name], changelog,
                        on_failure=lambda exc: end_for_restart(f"state of {p.name} not written ({exc!r})"))


# State changes wait in each store, and regrouped events in the topology, until a commit writes and sends them
# (streams/engine/write_back.py) or, for regrouped events, until CLOCKTOWER_STREAMS_REGROUP_LINGER_MS has passed.
regroup_linger_s = settings.streams_regroup_linger_ms / 1000
topology = Topology(processors, CommandIssuer(signer), budget, _table, settings.streams_max_entries, write_back=True,
                    regroup_linger_s=regroup_linger_s)


def _before_commit() -> int:
    """Sends what regrouped events wait and writes the pending state, behind the commit barrier. Any failure ends
    the worker at once: a commit after it could pass over records whose state or outputs were lost."""
    try:
        outs = topology.drain_regrouped()
        regrouped.put(outs)
        return topology.write_pending() + len(outs)
    except Exception as exc:  # noqa: BLE001 - ends the worker; its restart reads the uncommitted records again
        log.exception("writing the state before a commit failed")
        end_for_restart(f"state not written before a commit ({exc!r})")
        raise


app.sensors.add(WriteBackOnCommit(_before_commit))
node_signing = NodeSigning()   # CLOCKTOWER_PRODUCER_KEY: check what nodes sign, sign what is published in their name
sign_outputs = output_signer(node_signing)
handlers = record_handlers(topology, identity_check(node_signing),
                           settings.max_future_skew_ns,   # CLOCKTOWER_MAX_FUTURE_SKEW_S
                           sign_outputs)
audit = HandledAudit(settings.streams_audit_dir, instance_id) if settings.streams_audit_dir else None
CHANGELOG_BUFFER = 10_000
_reload = True   # rebuild the stores' expiry indexes after each rebalance, once the tables are recovered


@app.on_partitions_revoked.connect
async def _revoked(sender: object, *args: object, **kwargs: object) -> None:
    dropped = topology.drop_pending()   # its records were not committed: read again by the partitions' owners
    if dropped:
        log.info("partitions revoked: %d pending state entries dropped, their records are read again", dropped)


@app.on_partitions_assigned.connect
async def _assigned(sender: object, *args: object, **kwargs: object) -> None:
    global _reload
    _reload = True


@app.task
async def _start() -> None:
    clocks.start()
    # Faust stops every agent whenever 100 records wait in its send_soon buffer, and drains them one by one.
    # The tables no longer feed it (their changelog goes in batches: streams/engine/changelog_batches.py); the
    # larger bound stays for whatever else of Faust's uses it, flushed before every offset commit all the same.
    app.producer.buffer.max_messages = CHANGELOG_BUFFER


commit_stall = CommitStall()
processed: dict[tuple[str, int], int] = {}   # per partition, the last record whose outputs were all sent


@app.timer(CHECK_S)
async def _check_commits() -> None:
    """A partition fetched ahead of its committed offset, neither moving, ends the worker for a restart
    (streams/commit_stall.py). The offsets are aiokafka's position and the broker's commit, not Faust's. Not
    counted during a rebalance: records fetched before it wait for the seek at its end, however long recovery takes."""
    global commit_stall
    if app.rebalancing:   # (a rebalance that never ends is not seen here: recovering a big table may take long)
        commit_stall = CommitStall()   # counts start again after it: positions are sought anew
        return
    try:
        thread = app.consumer._thread
        offsets = await asyncio.wait_for(thread.call_thread(positions_and_commits, thread._ensure_consumer(),
                                                            app.topics.acks_enabled_for), CHECK_S)
    except Exception:  # noqa: BLE001 - a check that fails (consumer not started, a rebalance) must not stop the worker
        log.warning("commit stall check skipped", exc_info=True)   # (a timeout too: the consumer thread is busy)
        return
    stalled = commit_stall.check({tp: (pos, committed, processed.get((tp.topic, tp.partition)))
                                  for tp, (pos, committed) in offsets.items()})
    for tp, (state, checks) in commit_stall.counting().items():
        if checks >= 3:   # what the next session needs to see a stall coming (issue 17)
            log.warning("%s:%d fetched ahead of its commit, nothing moving for %d checks (position, committed, "
                        "processed: %s)", tp.topic, tp.partition, checks, state)
    if stalled:
        counted = commit_stall.counting()
        where = sorted(f"{tp.topic}:{tp.partition} (position, committed, processed {counted[tp][0]}, "
                       f"{counted[tp][1]} checks)" for tp in stalled)
        end_for_restart(f"partitions fetched ahead of their committed offset, no offset moving: {where}; "
                        "its restart handles them again")


if regroup_linger_s > 0:
    @app.timer(regroup_linger_s)
    async def _regrouped_due() -> None:
        """Regrouped events that waited their linger go out even when no record comes to take them along."""
        regrouped.put(topology.regrouped_ready())


@app.timer(settings.streams_tick_s)
async def _tick() -> None:
    """This worker's tick on control.ticks: the allocator, wherever it runs, re-checks the requests its budget
    withheld even when no request or ack comes (schemas/operations.py StreamsTick)."""
    try:
        for out in records([StreamsTick(node=bounded_name(instance_id), ts_ns=time.time_ns())]):
            if sign_outputs is not None:
                out = sign_outputs(out)     # in this worker's name: unsigned ticks are dead-lettered (with a key)
            await _send(out, critical=False)
    except Exception:  # noqa: BLE001 - a timer that raises would end the worker (mode crashes the app): next tick
        log.warning("this worker's tick on control.ticks was not sent; the next one is due in %.0f s",
                    settings.streams_tick_s, exc_info=True)


async def _send(out: Out, critical: bool = True) -> None:
    """Hand a record to the producer: aiokafka's own send, not Faust's topic layers (a third of the cost of a send,
    issue 19); every offset commit waits for what was handed (Faust flushes the producer first). A record the
    producer refuses or the broker never takes ends the worker at once (its restart reads the record's input
    again): Faust would ack the record and let a later commit pass it. `critical` False (a tick): only logged."""
    try:
        delivery = await app.producer.send(out.topic, out.key, out.value, out.partition, None, out.headers)
    except Exception as exc:  # noqa: BLE001 - see above
        if not critical:
            raise
        end_for_restart(f"a record for {out.topic} was not handed to the producer ({exc!r})")
        raise
    delivery.add_done_callback(partial(_delivered, out.topic, critical))


regrouped = OrderedSends(barrier, _send)   # regrouped records, in order, behind the barrier (streams/engine/)


def _delivered(topic: str, critical: bool, delivery: asyncio.Future) -> None:
    exc = asyncio.CancelledError() if delivery.cancelled() else delivery.exception()
    if exc is None:
        return
    if not critical:
        log.warning("a record for %s was not sent: %r", topic, exc)
        return
    end_for_restart(f"a record for {topic} was not sent ({exc!r})")   # even while stopping: no commit after it


async def _process(name: str, stream: faust.StreamT) -> None:
    global _reload
    handler = handlers[name]
    async for event in stream.events():
        if _reload:
            topology.reload()
            _reload = False
        msg = event.message
        headers = list(msg.headers or ())   # the record's own list: Faust's event.headers is a dict
        outs = handler.handle(name, msg.partition, msg.offset, event.key, event.value, headers)
        regrouped.put(topology.regrouped_ready())   # at once, before any await: see streams/engine/ordered_sends.py
        if audit is not None:
            audit.record(name, msg.partition, msg.offset)
        for out in outs:
            await _send(out)
        processed[(name, msg.partition)] = msg.offset   # acked as soon as the agent asks for the next record


def _agent_for(name: str) -> None:
    async def agent(stream: faust.StreamT) -> None:
        await _process(name, stream)

    agent.__name__ = "agent_" + name.replace(".", "_").replace("-", "_")
    topic = app.topic(name, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")
    app.agent(topic, name=agent.__name__)(agent)


for _name in handlers:
    _agent_for(_name)
