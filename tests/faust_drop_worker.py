"""A Faust worker that meets a rebalance at a chosen moment, for tests/test_faust_fixes.py.

`python tests/faust_drop_worker.py BOOTSTRAP TOPIC EXPECT OUT FIXES [RACE]`: one agent reads TOPIC (never
committed before) and writes the offsets it was handed to OUT as JSON (every one, duplicates included) once 8 s
pass with nothing new after the race, then goes on running (the test reads the group's commit, then kills it).

FIXES: `all` (streams/engine/faust_fixes), `log-only` (its discard report, without the rewind of never-committed
partitions), `no-skip` (all but the skip of records a seek asked for again), `no-revoke-commit` (all but the
commit before a revoke) or `none` (upstream Faust). RACE:
- `stop-flow` (the default): the first fetch that returns records of TOPIC stops Faust's flow before Faust looks
  at them, as a rebalance starting while a fetch is in flight does, and flow resumes 1 s later;
- `seek-mid-batch`: when record SEEK_AT of the first batch is handed on, the streams are suspended and their
  queues cleared, as a rebalance does (the records before it that the slow agent has not taken yet are dropped),
  and 0.5 s later Faust seeks to the committed offsets and resumes the streams, as the end of a recovery does with
  flow already running (`Recovery.on_recovery_completed`), while that record still waits to be queued;
- `revoke`: once EXPECT records are handed on, the consumer rejoins its group (a rebalance: revoke, then assign).
  Periodic commits are off (every 300 s), so only a commit at the revoke keeps them from being read again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time

import faust
from faust.transport.conductor import Conductor
from faust.transport.consumer import Consumer, ThreadDelegateConsumer

from clocktower.streams.engine import faust_fixes

bootstrap, topic_name, expect, out_path, fixes = sys.argv[1:6]
race = sys.argv[6] if len(sys.argv) > 6 else "stop-flow"
SEEK_AT = 10
if fixes != "none":
    faust_fixes.install()
if fixes == "log-only":
    from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread
    AIOKafkaConsumerThread.seek_to_committed = faust_fixes._original_seek_to_committed
if fixes == "no-skip":
    faust_fixes.skip_sought_back = False
if fixes == "no-revoke-commit":
    Consumer.on_partitions_revoked = faust_fixes._original_on_partitions_revoked

app = faust.App(f"drop-test-{os.getpid()}", broker=f"kafka://{bootstrap}", store="memory://", web_enabled=False,
                datadir=os.path.join(os.path.dirname(out_path), "faust-data"),   # the test's tmp dir, not the cwd
                topic_disable_leader=True, topic_allow_declare=False, consumer_auto_offset_reset="earliest",
                broker_session_timeout=10.0, stream_wait_empty=True,
                broker_commit_interval=300.0 if race == "revoke" else 2.8)
topic = app.topic(topic_name, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")
handed: list[int] = []
last_news = time.monotonic()
armed = True
finished = False
_original_getmany = ThreadDelegateConsumer._getmany
_original_compile = Conductor._compile_message_handler


async def _getmany_then_race(self, active_partitions, timeout):  # noqa: ANN001, ANN202 - Faust's signature
    global armed, last_news
    records = await _original_getmany(self, active_partitions, timeout)
    if race != "revoke" and armed and any(tp.topic == topic_name for tp in records):
        armed = False
        last_news = time.monotonic()   # the 8 s with nothing new count from here
        offsets = [r.offset for rs in records.values() for r in rs]
        if race == "stop-flow":
            print(f"flow stopped with offsets {offsets} fetched", flush=True)
            self.stop_flow()
            asyncio.get_running_loop().call_later(1.0, self.resume_flow)
        else:
            print(f"first batch with offsets {offsets} fetched", flush=True)
    return records


def _compile_with_seek(self):  # noqa: ANN001, ANN202 - Faust's signature
    handler = _original_compile(self)

    async def on_message(message):  # noqa: ANN001, ANN202
        global raced
        if race == "seek-mid-batch" and message.topic == topic_name and message.offset == SEEK_AT and not raced:
            raced = True
            app.flow_control.suspend()
            app.flow_control.clear()
            asyncio.get_running_loop().create_task(_end_recovery())
        return await handler(message)

    return on_message


async def _end_recovery() -> None:
    await asyncio.sleep(0.5)
    print(f"seek while offset {SEEK_AT} is handed on", flush=True)
    await app.consumer.perform_seek()
    app.flow_control.resume()


async def _rejoin(consumer) -> None:  # noqa: ANN001 - aiokafka's consumer, on its own thread
    consumer._coordinator.request_rejoin()


raced = False
ThreadDelegateConsumer._getmany = _getmany_then_race
Conductor._compile_message_handler = _compile_with_seek


def _finish() -> None:
    global finished
    finished = True
    with open(out_path + ".tmp", "w") as f:
        json.dump(handed, f)
    os.replace(out_path + ".tmp", out_path)
    print(f"handed {len(handed)} records", flush=True)


@app.agent(topic)
async def reader(stream: faust.StreamT) -> None:
    global last_news
    async for event in stream.events():
        handed.append(event.message.offset)
        last_news = time.monotonic()
        if race == "seek-mid-batch":
            await asyncio.sleep(0.05)   # a slow agent: records queue up behind it


@app.timer(0.5)
async def _race_or_give_up() -> None:
    global armed, last_news
    if race == "revoke" and armed and len(set(handed)) >= int(expect) and time.monotonic() - last_news > 1:
        armed = False   # (nothing in flight: every record handed on is acked, and none is committed)
        last_news = time.monotonic()
        print("rejoining the group", flush=True)
        await app.consumer._thread.call_thread(_rejoin, app.consumer._thread._ensure_consumer())
    if not armed and not finished and time.monotonic() - last_news > 8:
        _finish()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    sys.argv = [sys.argv[0], "worker", "--without-web", "-l", "info"]
    app.main()
