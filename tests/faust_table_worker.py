"""A Faust worker with one rocksdb table, for tests/test_faust_fixes.py's check of a local store that is ahead of
its changelog.

`python tests/faust_table_worker.py BOOTSTRAP TOPIC DATADIR FIXES`: app `table-test` counts TOPIC's records per key
in the table `counts` (changelog `table-test-counts-changelog`) and prints `counted KEY N` for each. FIXES: `all`
(streams/engine/faust_fixes) or `none` (upstream Faust).
"""

from __future__ import annotations

import logging
import sys

import faust

from clocktower.streams.engine import faust_fixes

bootstrap, topic_name, datadir, fixes = sys.argv[1:5]
if fixes != "none":
    faust_fixes.install()

app = faust.App("table-test", broker=f"kafka://{bootstrap}", store="rocksdb://", web_enabled=False, datadir=datadir,
                topic_disable_leader=True, topic_allow_declare=False, consumer_auto_offset_reset="earliest",
                broker_session_timeout=10.0, topic_partitions=1)
topic = app.topic(topic_name, key_type=str, value_type=bytes, value_serializer="raw")
counts = app.Table("counts", default=int, partitions=1)


@app.agent(topic)
async def count(stream: faust.StreamT) -> None:
    async for key, _value in stream.items():
        counts[key] += 1
        print(f"counted {key} {counts[key]}", flush=True)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    sys.argv = [sys.argv[0], "worker", "--without-web", "-l", "info"]
    app.main()
