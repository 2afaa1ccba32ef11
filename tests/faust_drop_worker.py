"""A Faust worker that meets a rebalance mid-fetch, for tests/test_faust_fixes.py.

`python tests/faust_drop_worker.py BOOTSTRAP TOPIC EXPECT OUT FIXES`: one agent reads TOPIC (never committed
before) and writes the offsets it was handed to OUT as JSON once it has EXPECT of them, or once 8 s pass with
nothing new. The first fetch that returns records of TOPIC stops Faust's flow before Faust looks at them, as a
rebalance starting while a fetch is in flight does, and flow resumes 1 s later. FIXES: `all` (streams/faust_fixes),
`log-only` (its discard report, without the rewind of never-committed partitions) or `none` (upstream Faust).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time

import faust
from faust.transport.consumer import ThreadDelegateConsumer

from clocktower.streams import faust_fixes

bootstrap, topic_name, expect, out_path, fixes = sys.argv[1:6]
if fixes != "none":
    faust_fixes.install()
if fixes == "log-only":
    from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread
    AIOKafkaConsumerThread.seek_to_committed = faust_fixes._original_seek_to_committed

app = faust.App(f"drop-test-{os.getpid()}", broker=f"kafka://{bootstrap}", store="memory://", web_enabled=False,
                datadir=os.path.join(os.path.dirname(out_path), "faust-data"),   # the test's tmp dir, not the cwd
                topic_disable_leader=True, topic_allow_declare=False, consumer_auto_offset_reset="earliest",
                broker_session_timeout=10.0, stream_wait_empty=True)
topic = app.topic(topic_name, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")
handed: list[int] = []
last_news = time.monotonic()
armed = True
_original_getmany = ThreadDelegateConsumer._getmany


async def _getmany_then_stop_flow(self, active_partitions, timeout):  # noqa: ANN001, ANN202 - Faust's signature
    global armed, last_news
    records = await _original_getmany(self, active_partitions, timeout)
    if armed and any(tp.topic == topic_name for tp in records):
        armed = False
        last_news = time.monotonic()   # the 8 s with nothing new count from here
        print(f"flow stopped with offsets {[r.offset for rs in records.values() for r in rs]} fetched", flush=True)
        self.stop_flow()
        asyncio.get_running_loop().call_later(1.0, self.resume_flow)
    return records


ThreadDelegateConsumer._getmany = _getmany_then_stop_flow


def _finish() -> None:
    with open(out_path + ".tmp", "w") as f:
        json.dump(handed, f)
    os.replace(out_path + ".tmp", out_path)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


@app.agent(topic)
async def reader(stream: faust.StreamT) -> None:
    global last_news
    async for event in stream.events():
        handed.append(event.message.offset)
        last_news = time.monotonic()
        if len(set(handed)) >= int(expect):
            _finish()


@app.timer(0.5)
async def _give_up() -> None:
    if not armed and time.monotonic() - last_news > 8:
        _finish()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    sys.argv = [sys.argv[0], "worker", "--without-web", "-l", "info"]
    app.main()
