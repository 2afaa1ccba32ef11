"""Issue 18: what a local user with no keys, a forged report or a broker crash could do, as regression tests.

Each test here is an attack that worked before its fix. The attacks that need a whole stack (a broker, the
streams, the sink, the actuators) live beside the component they attack, and are listed here so that this file
is the index of what was tried:

| finding | attack | where its test is |
|---|---|---|
| default | an unsigned XID 79 from an invented node ordered a drain | test_signed_by_default.py |
| 1 | one oversized fetch wedged the sink and the actuators | test_actuator_consumer.py, test_broker_profile.py |
| 2 | a report naming `backup="lo"` moved a node's default route to lo | test_actuator.py |
| 3 | ghost nodes spent the budget; a withheld request was never retried | here, test_replacement_allocator.py |
| 4 | readings dated ahead made a node's real readings look redelivered | here, test_envelope_checks.py (30 s skew) |
| 5 | a table store ahead of its changelog crash-looped the streams | test_faust_fixes.py |
| 7 | a replayed replacement request was granted again | test_replacement_allocator.py |
| 8 | `control release` believed an unsigned ack | test_actuator_component.py, test_signed_by_default.py |
| 9, 10 | planted state dir, data dir, routes file and log symlinks | test_actuator_component.py, test_data_dir*.py |
| 11 | forged commands delayed genuine ones; each refusal was logged | test_actuator_consumer.py, test_actuator.py |
| 13 | commands dated ahead, request smuggling, one record's 100 refused acks | test_actuator.py, test_endpoint*.py |

The attacks on the endpoint and the clock probes of issue 8 are in test_endpoint_probe_attacks.py.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from clocktower.schemas.analytics import Incident
from clocktower.schemas.codec import decode_batch, encode_batch
from clocktower.schemas.control import ReplacementRequest
from clocktower.schemas.event import Event
from clocktower.streams.emit import Out
from clocktower.streams.processors import Processors
from clocktower.streams.record_handler import RecordHandler
from tests.control_keys import TEST_SIGNER
from tests.event_samples import gpu_health, link_state

S = 10**9
DAY_NS = 24 * 3600 * S


class Partition:
    """One partition of a topic as the streams read it: each record at the next offset, or at a given one."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.handler = RecordHandler(Processors(TEST_SIGNER), max_future_skew_ns=DAY_NS)  # as before finding 4's cap
        self.records: list[tuple[bytes | None, bytes, list]] = []

    def publish(self, events: Sequence[Event]) -> list[Event]:
        k, v, h = encode_batch(list(events))
        self.records.append((k, v, h))
        return self.read(len(self.records) - 1)

    def read(self, offset: int) -> list[Event]:
        """The events the streams publish for the record at `offset` (again, for a replay)."""
        k, v, h = self.records[offset]
        outs: list[Out] = self.handler.handle(self.topic, 0, offset, k, v, h)
        return [e for o in outs if o.topic != "deadletter" for e in decode_batch(o.topic, o.key, o.value, o.headers,
                                                                                  max_future_skew_ns=DAY_NS).events]


def test_readings_dated_a_day_ahead_do_not_hide_a_real_xid79() -> None:
    """Before: eight readings dated 23 h ahead made every real reading of the GPU count as redelivered, and a
    real XID 79 opened no incident. Redelivery is now told by offset (streams/delivery.py)."""
    gpus = Partition("telemetry.gpu")
    now = time.time_ns()
    gpus.publish([gpu_health(ts_ns=now - 400 * S)])
    for i in range(8):
        assert gpus.publish([gpu_health(ts_ns=now + 23 * 3600 * S + i)]) == []
    out = gpus.publish([gpu_health(ts_ns=now, lost=True, xid=79)])
    assert {Incident, ReplacementRequest} <= {type(e) for e in out}
    assert gpus.handler.router.processor("gpu_fault").counters()["redelivered"] == 0


def test_a_replay_by_offset_re_emits_and_applies_nothing_twice() -> None:
    """The other side of the same rule: the records a killed worker reads again (same offsets) change nothing."""
    gpus = Partition("telemetry.gpu")
    now = time.time_ns()
    gpus.publish([gpu_health(ts_ns=now - 400 * S)])     # known to the fleet for longer than the 300 s default
    first = gpus.publish([gpu_health(ts_ns=now, lost=True, xid=79)])
    assert _ids(gpus.read(1)) == _ids(first) and len(first) == 4 and gpus.read(0) == []
    assert gpus.handler.router.processor("gpu_fault").counters()["redelivered"] == 2


def _ids(events: list[Event]) -> list[str]:
    """What a replay must give again: the same incidents, requests and command ids (a command's signing time is
    the issuer's clock, so its bytes differ)."""
    return sorted(getattr(e, "command_id", None) or e.model_dump_json() for e in events)


def test_link_reports_dated_ahead_do_not_hide_a_real_carrier_loss() -> None:
    """Before: the same with link reports: a real carrier loss opened no incident and was never restored."""
    links = Partition("telemetry.links")
    now = time.time_ns()
    links.publish([link_state(ts_ns=now - 10 * S, backup="eth1")])
    for i in range(8):
        links.publish([link_state(ts_ns=now + 23 * 3600 * S + i, backup="eth1")])
    out = links.publish([link_state(ts_ns=now, up=False, carrier_changes=1, backup="eth1")])
    out += links.publish([link_state(ts_ns=now + 2 * S, up=False, carrier_changes=1, backup="eth1")])
    incidents = [e for e in out if isinstance(e, Incident)]
    assert [(i.kind, i.state) for i in incidents] == [("link_down", "open")], out


def _drains(events: list[Event]) -> list[str]:
    return [e.node for e in events if getattr(e, "action", None) == "drain"]


def _detail(events: list[Event]) -> str:
    return " | ".join(e.detail for e in events if isinstance(e, Incident))


def test_an_invented_node_spends_no_budget_until_it_has_reported_for_a_while() -> None:
    """Before: forged XID 79s from two invented node names used the fleet's budget of 2 replacements an hour, and
    a real node's lost GPU was then withheld. Now a node not listed must have reported for
    CLOCKTOWER_STREAMS_KNOWN_AFTER_S (300 s) before it spends budget; until then it is held for approval."""
    gpus = Partition("telemetry.gpu")
    now = time.time_ns()
    gpus.publish([gpu_health(node="real", ts_ns=now - 600 * S)])
    ghosts = [gpus.publish([gpu_health(node=f"ghost-{i}", ts_ns=now, lost=True, xid=79)]) for i in range(3)]
    for out in ghosts:
        assert _drains(out) == [] and "less than the 300 s that makes it known" in _detail(out)
    assert gpus.handler.router.budget.withheld == 0   # held back before the budget was asked
    assert _drains(gpus.publish([gpu_health(node="real", ts_ns=now, lost=True, xid=79)])) == ["real"]


def test_a_first_reading_dated_back_does_not_make_a_node_known() -> None:
    """An invented node whose first reading claims to be an hour old is aged from no earlier than 120 s before its
    partition's time (the other nodes' readings), not from the date it claims."""
    gpus = Partition("telemetry.gpu")
    now = time.time_ns()
    for i in range(3):
        gpus.publish([gpu_health(node=f"real-{i}", ts_ns=now)])
    gpus.publish([gpu_health(node="ghost", ts_ns=now - 3600 * S)])
    out = gpus.publish([gpu_health(node="ghost", ts_ns=now + S, lost=True, xid=79)])
    assert _drains(out) == [] and "had reported for 121 s" in _detail(out)


def test_invented_names_cannot_grow_the_state_past_its_cap_and_a_known_node_is_still_watched() -> None:
    """Before: 600 invented node names took a worker from 122 to 422 MB, kept for the detectors' 24 h. Now a
    partition keeps at most CLOCKTOWER_STREAMS_MAX_ENTRIES per processor; new keys past it are refused and counted,
    and keys kept before the flood are still updated."""
    from prometheus_client import REGISTRY

    gpus = Partition("telemetry.gpu")
    store = gpus.handler.router.runners["gpu_fault"].store
    store.max_entries = 40
    now = time.time_ns()
    gpus.publish([gpu_health(node="real", ts_ns=now - 600 * S)])
    before = REGISTRY.get_sample_value("clocktower_streams_state_refused_total", {"processor": "gpu_fault"}) or 0
    for i in range(100):
        gpus.publish([gpu_health(node=f"ghost-{i}", ts_ns=now)])
    assert len(store.backing) == 40 and store.refused == 61
    after = REGISTRY.get_sample_value("clocktower_streams_state_refused_total", {"processor": "gpu_fault"})
    assert after == before + 61
    assert _drains(gpus.publish([gpu_health(node="real", ts_ns=now, lost=True, xid=79)])) == ["real"]


def test_each_table_partition_opens_rocksdb_with_bounded_memory(tmp_path) -> None:  # noqa: ANN001
    """Before: Faust's defaults (3 write buffers of 64 MiB and a 2 GiB block cache per partition) let a worker's
    memory grow with every write to its state. The streams' tables now open with streams/table_memory.py's bounds."""
    import faust

    from clocktower.streams import table_memory

    app = faust.App("bounded-tables", broker="kafka://127.0.0.1:1", store="rocksdb://", datadir=str(tmp_path))
    table = app.Table("x", partitions=2, key_type=bytes, value_type=bytes, options=table_memory.table_options())
    opts = table.data.rocksdb_options
    assert (opts.write_buffer_size, opts.max_write_buffer_number, opts.block_cache_size) == (
        table_memory.WRITE_BUFFER_BYTES, table_memory.WRITE_BUFFERS, table_memory.BLOCK_CACHE_BYTES)
    assert "options=table_options()" in (Path(table_memory.__file__).parent / "app.py").read_text()
