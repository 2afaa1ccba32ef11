"""Issue 18, "a default that closes most of this": `up` and `demo` make a producer key in the data dir and every
publisher they start signs with it (a node's records with that node's key), so the streams act only on what a node
signed. A record from outside, unsigned, is still stored (the sink) and shown (its dead letter), but causes nothing.

Before: on the defaults, an unsigned XID 79 from an invented node name was a fault like any other: it opened an
incident, spent the fleet's remediation budget and ordered a drain.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from clocktower.config import Settings
from clocktower.demo import _wait_for_tables
from clocktower.ports import free_port
from clocktower.producers.kafka_publisher import KafkaPublisher
from clocktower.runtime.clickhouse_client import http_client
from clocktower.runtime.credentials import producer_key_of
from clocktower.stack import Stack
from tests.event_samples import GPU_READINGS, gpu_health

LOST = {**{k: [] if isinstance(v, list) else None for k, v in GPU_READINGS.items()}, "lost": True, "xid": 79}


@pytest.fixture
def signed_stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Stack]:
    for var in ("CLOCKTOWER_PRODUCER_KEY", "CLOCKTOWER_PRODUCER_KEY_FILE"):
        monkeypatch.delenv(var, raising=False)
    settings = Settings(data_dir=tmp_path / "ct", kafka_port=free_port(), http_port=free_port(), kafka_bootstrap=None,
                        clickhouse_url=None, flush_interval_s=0.5)
    stack = Stack(settings, sign_records=True)   # as `up` and `demo` build theirs
    stack.start()
    try:
        yield stack
    finally:
        stack.stop()


def test_the_stack_makes_a_private_producer_key_and_an_unsigned_xid79_drains_nothing(signed_stack: Stack) -> None:
    key_file = signed_stack.data_dir / "producer.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600 and key_file.stat().st_uid == os.geteuid()
    assert signed_stack.producer_key is not None and producer_key_of(signed_stack.data_dir) == signed_stack.producer_key
    s = signed_stack.s
    client = http_client(s.clickhouse, *s.clickhouse_login(), s.clickhouse_database)
    _wait_for_tables(client, signed_stack)   # the sink makes them as it starts
    fleet = KafkaPublisher(s.bootstrap, producer_key=signed_stack.producer_key)   # as the demo's simulated fleet
    outsider = KafkaPublisher(s.bootstrap)                                         # kcat, or a local user: unsigned
    now = time.time_ns()
    for publisher, node in ((fleet, "node-real"), (outsider, "node-ghost")):
        publisher.publish([gpu_health(node, now - 2 * 10**9, gpu=3), gpu_health(node, now - 10**9, gpu=3, **LOST)])
        assert publisher.flush(10) == 0

    def rows(sql: str) -> list[tuple]:
        return [tuple(r) for r in client.query(sql).result_rows]

    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        drains = rows("SELECT node FROM control_commands WHERE action = 'drain'")
        dead = rows("SELECT node, reason FROM deadletter WHERE node = 'node-ghost'")
        if drains and len(dead) >= 1:
            break
        time.sleep(0.5)
    time.sleep(2.0)   # anything the ghost's records would cause has had its time too
    assert rows("SELECT node FROM control_commands WHERE action = 'drain'") == [("node-real",)]
    assert {n for (n,) in rows("SELECT DISTINCT node FROM incidents")} == {"node-real"}
    dead = rows("SELECT node, reason FROM deadletter WHERE node = 'node-ghost'")
    assert dead and all(reason.startswith("identity: ") for _, reason in dead), dead
    # stored and shown all the same: the sink lands the ghost's readings, which the dead letters name as unsigned
    assert rows("SELECT count() FROM gpu_health WHERE node = 'node-ghost'") == [(2,)]
