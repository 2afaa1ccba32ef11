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


def _signed_stack(data_dir: Path, monkeypatch: pytest.MonkeyPatch, **worker_env: str) -> Stack:
    for var in ("CLOCKTOWER_PRODUCER_KEY", "CLOCKTOWER_PRODUCER_KEY_FILE", "CLOCKTOWER_NODE_KEY"):
        monkeypatch.delenv(var, raising=False)
    # the outsider's publisher must not find a producer key in this checkout's own .clocktower (after `make demo`,
    # a publisher beside it signs with that key: runtime/local_signing.py)
    monkeypatch.setenv("CLOCKTOWER_DATA_DIR", str(data_dir.parent / "no-up-here"))
    settings = Settings(data_dir=data_dir, kafka_port=free_port(), http_port=free_port(), kafka_bootstrap=None,
                        clickhouse_url=None, flush_interval_s=0.5)
    # every node is known from its first reading, so that only the signature stands between a ghost and a drain
    worker_env = {"CLOCKTOWER_STREAMS_KNOWN_AFTER_S": "0", **worker_env}
    stack = Stack(settings, sign_records=True, extra_env=worker_env)   # as `up` and `demo` build theirs
    stack.start()
    return stack


@pytest.fixture
def signed_stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Stack]:
    stack = _signed_stack(tmp_path / "ct", monkeypatch)
    try:
        yield stack
    finally:
        stack.stop()


def _rows(stack: Stack, sql: str) -> list[tuple]:
    s = stack.s
    client = http_client(s.clickhouse, *s.clickhouse_login(), s.clickhouse_database)
    return [tuple(r) for r in client.query(sql).result_rows]


def _wait_rows(stack: Stack, sql: str, timeout: float = 90) -> list[tuple]:
    deadline = time.monotonic() + timeout
    while not (found := _rows(stack, sql)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return found


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
    assert rows("SELECT node FROM replacement_requests") == [("node-real",)]   # the ghost asked for nothing
    dead = rows("SELECT node, reason FROM deadletter WHERE node = 'node-ghost'")
    assert dead and all(reason.startswith("identity: ") for _, reason in dead), dead
    # stored and shown all the same, each row flagged: the sink checks the same signature the streams check
    assert rows("SELECT node, _node_mac, count() FROM gpu_health GROUP BY node, _node_mac ORDER BY node") == [
        ("node-ghost", "none", 2), ("node-real", "valid", 2)]


def test_control_approve_orders_a_withheld_replacement_and_a_forged_approval_orders_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 18 finding 3: a lost GPU over the fleet's budget was "withheld, needs human approval", and no command
    could approve it. `clocktower control approve NODE INCIDENT` signs the request with the control key; a request
    "approved" with any other key (a node's, a forger's) orders nothing."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from clocktower.control.approval import approve
    from clocktower.control.signing import CommandSigner
    from clocktower.schemas.control import ReplacementRequest
    from tests.test_cli import _env, clocktower

    stack = _signed_stack(tmp_path / "ct", monkeypatch, CLOCKTOWER_REMEDIATION_MAX_PER_HOUR="0")
    try:
        s = stack.s
        _wait_for_tables(http_client(s.clickhouse, *s.clickhouse_login(), s.clickhouse_database), stack)
        fleet = KafkaPublisher(s.bootstrap, producer_key=stack.producer_key)
        now = time.time_ns()
        for node in ("node-a", "node-b"):
            fleet.publish([gpu_health(node, now - 2 * 10**9, gpu=1), gpu_health(node, now - 10**9, gpu=1, **LOST)])
        assert fleet.flush(10) == 0
        requests = _wait_rows(stack, "SELECT node, incident_id, ts_ns, reason, gpu FROM replacement_requests "
                                     "ORDER BY node")
        deadline = time.monotonic() + 60
        while len(requests) < 2 and time.monotonic() < deadline:
            requests = _rows(stack, "SELECT node, incident_id, ts_ns, reason, gpu FROM replacement_requests "
                                    "ORDER BY node")
            time.sleep(0.5)
        assert [r[0] for r in requests] == ["node-a", "node-b"]
        # the first answer: withheld (the budget is 0), or, where the fault reached the allocator too late, refused
        first = _wait_rows(stack, "SELECT detail FROM incidents WHERE detail LIKE 'drain and spare withheld%' "
                                  "OR detail LIKE 'drain and spare not ordered%'")
        assert first and first[0][0].startswith("drain and spare withheld"), first
        (node_a, inc_a, *_), (node_b, inc_b, ts_b, reason_b, gpu_b) = requests
        forged = approve(CommandSigner(Ed25519PrivateKey.generate()),
                         ReplacementRequest(node=node_b, ts_ns=ts_b, incident_id=inc_b, reason=reason_b, gpu=gpu_b))
        fleet.publish([forged])                                     # node-signed, but not by the control key
        assert fleet.flush(10) == 0
        r = clocktower("control", "approve", node_a, inc_a, "--wait", "0", "--data-dir", str(s.data_dir),
                       env=_env())
        assert r.returncode == 0 and "sent the approval" in r.stdout, r.stderr
        assert _wait_rows(stack, "SELECT node FROM control_commands WHERE action = 'drain'") == [(node_a,)]
        time.sleep(2.0)   # (the forged approval, sent first, wrote no row: it would replace the withheld one)
        assert _rows(stack, f"SELECT count() FROM incidents WHERE incident_id = '{inc_b}' "
                            "AND detail LIKE 'drain and spare withheld%'") == [(1,)]
        assert _rows(stack, "SELECT node FROM control_commands WHERE action = 'drain'") == [(node_a,)]
        missing = clocktower("control", "approve", node_a, "inc-nope", "--wait", "0", "--data-dir", str(s.data_dir),
                             env=_env())
        assert missing.returncode == 2 and "no replacement request of node-a for incident inc-nope" in missing.stderr
    finally:
        stack.stop()


def test_a_withheld_replacement_is_settled_by_the_workers_tick_when_no_other_input_comes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 18 finding 3: a withheld request was asked again only at the allocator's next request or ack, so in a
    quiet fleet never: not granted when the budget allowed, nor given up as too old for a human to see. Each stream
    worker now publishes a tick (control.ticks); here nothing else comes after the one request, and the tick gives
    it up once its fault passes the age limit."""
    stack = _signed_stack(tmp_path / "ct", monkeypatch, CLOCKTOWER_REMEDIATION_MAX_PER_HOUR="0",
                          CLOCKTOWER_STREAMS_MAX_FAULT_AGE_S="20", CLOCKTOWER_STREAMS_TICK_S="1")
    try:
        s = stack.s
        _wait_for_tables(http_client(s.clickhouse, *s.clickhouse_login(), s.clickhouse_database), stack)
        # Faust starts timers once its tables are recovered: the first tick stored says the worker runs (the fault
        # must reach the allocator within its 20 s age limit to be withheld, not refused as too old: a second or two)
        assert _wait_rows(stack, "SELECT 1 FROM streams_ticks LIMIT 1")
        fleet = KafkaPublisher(s.bootstrap, producer_key=stack.producer_key)
        now = time.time_ns()
        fleet.publish([gpu_health("node-a", now - 10**9, gpu=1), gpu_health("node-a", now, gpu=1, **LOST)])
        assert fleet.flush(10) == 0
        # the first answer: withheld (the budget is 0), or, where the fault reached the allocator too late, refused
        first = _wait_rows(stack, "SELECT detail FROM incidents WHERE detail LIKE 'drain and spare withheld%' "
                                  "OR detail LIKE 'drain and spare not ordered%'")
        assert first and first[0][0].startswith("drain and spare withheld"), first
        given_up = _wait_rows(stack, "SELECT detail FROM incidents WHERE detail LIKE "
                                     "'withheld drain and spare not ordered: the fault is now%'", timeout=120)
        assert given_up and "it needs a human" in given_up[0][0]
        assert _rows(stack, "SELECT count() FROM control_commands") == [(0,)]
        # signed in the worker's name, read by the streams (not dead-lettered), flagged valid by the sink
        assert _rows(stack, "SELECT count() FROM deadletter WHERE origin_topic = 'control.ticks'") == [(0,)]
        assert _rows(stack, "SELECT DISTINCT _node_mac FROM streams_ticks") == [("valid",)]
    finally:
        stack.stop()
