"""Issue 18: what a local user with no keys, a forged report or a broker crash could do, as regression tests.

Each test here is an attack that worked before its fix. The attacks that need a whole stack (a broker, the
streams, the sink, the actuators) live beside the component they attack, and are listed here so that this file
is the index of what was tried:

| finding | attack | where its test is |
|---|---|---|
| default | an unsigned XID 79 from an invented node ordered a drain | test_signed_by_default.py |
| 1 | one oversized fetch wedged the sink and the actuators | test_actuator_consumer.py, test_broker_profile.py |
| 1 | a flood of 1 MiB records on the control topics was kept for 90 days | test_topic_partitions.py |
| 2 | a report naming `backup="lo"` moved a node's default route to lo | test_actuator.py |
| 3 | ghosts spent the budget; no retry of withheld | here, test_replacement_allocator.py, test_signed_by_default.py |
| 4 | readings dated ahead made a node's real readings look redelivered | here, test_envelope_checks.py (30 s skew) |
| 4 (review) | a captured signed link report, published again, failed over and quarantined | here |
| 5 | a table store ahead of its changelog crash-looped the streams | test_faust_fixes.py |
| 6 | acked records a killed broker lost were not counted | test_spooling_publisher.py, test_lost_acks.py |
| 7 | a replayed replacement request was granted again | test_replacement_allocator.py |
| 8 | `control release` believed an unsigned ack | test_actuator_component.py, test_signed_by_default.py |
| 9, 10 | planted state dir, data dir, routes file and log symlinks | test_actuator_component.py, test_data_dir*.py |
| 11 | forged commands delayed genuine ones; each refusal was logged | test_actuator_consumer.py, test_actuator.py |
| 12 | invented names grew the streams' state (and RocksDB's buffers) for 24 h | here, test_state_store.py |
| 13 | commands dated ahead, request smuggling, one record's 100 refused acks | test_actuator.py, test_endpoint*.py |

The attacks on the endpoint and the clock probes of issue 8 are in test_endpoint_probe_attacks.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

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

    def __init__(self, topic: str, clock_ns: Callable[[], int] = time.time_ns) -> None:
        """`clock_ns`: the worker's wall clock."""
        self.topic = topic
        self.handler = RecordHandler(Processors(TEST_SIGNER, clock_ns=clock_ns))   # the default future skew: 30 s
        self.records: list[tuple[bytes | None, bytes, list]] = []

    def publish(self, events: Sequence[Event]) -> list[Event]:
        k, v, h = encode_batch(list(events))
        self.records.append((k, v, h))
        return self.read(len(self.records) - 1)

    def copy(self, offset: int) -> list[Event]:
        """Publish the record at `offset` again, as captured (its node's signature still valid), at a new offset."""
        self.records.append(self.records[offset])
        return self.read(len(self.records) - 1)

    def read(self, offset: int) -> list[Event]:
        """The events the streams publish for the record at `offset` (again, for a replay)."""
        k, v, h = self.records[offset]
        outs: list[Out] = self.handler.handle(self.topic, 0, offset, k, v, h)
        return [e for o in outs if o.topic != "deadletter" for e in decode_batch(o.topic, o.key, o.value, o.headers,
                                                                                  max_future_skew_ns=DAY_NS).events]


def test_readings_dated_ahead_do_not_hide_a_real_xid79() -> None:
    """Before: eight readings dated 23 h ahead made every real reading of the GPU count as redelivered, and a
    real XID 79 opened no incident. Now no reading may be dated more than 30 s ahead, and a reading counts as seen
    only if replayed at its position, applied at its time, or 60 s older than the newest (delivery_log.py)."""
    gpus = Partition("telemetry.gpu")
    now = time.time_ns()
    gpus.publish([gpu_health(ts_ns=now - 400 * S)])
    for i in range(20):                      # more than the 16 times a GPU's entry keeps
        assert gpus.publish([gpu_health(ts_ns=now + 29 * S + i)]) == []
    out = gpus.publish([gpu_health(ts_ns=now, lost=True, xid=79)])
    assert {Incident, ReplacementRequest} <= {type(e) for e in out}
    assert gpus.handler.router.processor("gpu_fault").counters()["redelivered"] == 0


def test_a_replay_by_offset_re_emits_and_applies_nothing_twice() -> None:
    """The other side of the same rule: the records a killed worker reads again (same offsets) change nothing."""
    now = time.time_ns()
    wall = [now - 400 * S]
    gpus = Partition("telemetry.gpu", clock_ns=lambda: wall[0])
    gpus.publish([gpu_health(ts_ns=now - 400 * S)])     # known to the fleet for longer than the 300 s default
    wall[0] = now
    first = gpus.publish([gpu_health(ts_ns=now, lost=True, xid=79)])
    assert _ids(gpus.read(1)) == _ids(first) and len(first) == 4 and gpus.read(0) == []
    assert gpus.handler.router.processor("gpu_fault").counters()["redelivered"] == 2


def test_a_captured_link_report_published_again_changes_nothing() -> None:
    """A node's signature proves who sent a record, not when: anyone who can write the topic can publish a captured
    one again. Found in review: with redelivery told by offset alone, each copy of a signed "link down" ordered a
    failover and a restore again, and the 8th a quarantine. A copy is now told by its time (applied within the
    last 60 s), and an older one is stale."""
    links = Partition("telemetry.links")
    t = time.time_ns() - 3000 * S
    for i in range(10):
        links.publish([link_state(ts_ns=t + i * S, backup="eth1")])
    links.publish([link_state(ts_ns=t + 10 * S, up=False, carrier_changes=1, backup="eth1")])
    down = len(links.records) - 1
    assert links.publish([link_state(ts_ns=t + 12 * S, carrier_changes=2, backup="eth1")])   # failover
    ts = t + 13 * S
    copies: list[Event] = []
    for _ in range(10):
        copies += [e for e in links.copy(down) if not isinstance(e, Incident) or e.state != "update"]
        for _ in range(13):
            copies += links.publish([link_state(ts_ns=ts, carrier_changes=2, backup="eth1")])
            ts += S
    actions = [getattr(e, "action", None) for e in copies]
    assert "quarantine" not in actions and actions.count("failover") <= 1, actions


def _ids(events: list[Event]) -> list[str]:
    """What a replay must give again: the same incidents, requests and command ids (a command's signing time is
    the issuer's clock, so its bytes differ)."""
    return sorted(getattr(e, "command_id", None) or e.model_dump_json() for e in events)


def test_link_reports_dated_ahead_delay_a_real_carrier_loss_by_the_skew_at_most() -> None:
    """Before: the same with link reports: a real carrier loss opened no incident and was never restored. Now
    reports dated up to 30 s ahead (the skew) make the real ones stale only until real time passes them: the link's
    next report, still down, opens the incident."""
    links = Partition("telemetry.links")
    now = time.time_ns() - 100 * S
    links.publish([link_state(ts_ns=now - 10 * S, backup="eth1")])
    for i in range(20):
        links.publish([link_state(ts_ns=now + 29 * S + i, backup="eth1")])
    out: list[Event] = []
    for k in range(0, 60):                   # the real link, down from `now`, reported every second
        out += links.publish([link_state(ts_ns=now + k * S, up=False, carrier_changes=1, backup="eth1")])
    incidents = [(i.kind, i.state) for i in out if isinstance(i, Incident)]
    assert incidents[:1] == [("link_down", "open")], out


def _drains(events: list[Event]) -> list[str]:
    return [e.node for e in events if getattr(e, "action", None) == "drain"]


def _detail(events: list[Event]) -> str:
    return " | ".join(e.detail for e in events if isinstance(e, Incident))


def test_an_invented_node_spends_no_budget_until_it_has_reported_for_a_while() -> None:
    """Before: forged XID 79s from two invented node names used the fleet's budget of 2 replacements an hour, and
    a real node's lost GPU was then withheld. Now a node not listed must have reported for
    CLOCKTOWER_STREAMS_KNOWN_AFTER_S (300 s) before it spends budget; until then it is held for approval."""
    now = time.time_ns()
    wall = [now - 600 * S]
    gpus = Partition("telemetry.gpu", clock_ns=lambda: wall[0])
    gpus.publish([gpu_health(node="real", ts_ns=now - 600 * S)])    # reporting for 10 min
    wall[0] = now
    ghosts = [gpus.publish([gpu_health(node=f"ghost-{i}", ts_ns=now, lost=True, xid=79)]) for i in range(3)]
    for out in ghosts:
        assert _drains(out) == [] and "less than the 300 s that makes it known" in _detail(out)
    assert gpus.handler.router.budget.withheld == 0   # held back before the budget was asked
    assert _drains(gpus.publish([gpu_health(node="real", ts_ns=now, lost=True, xid=79)])) == ["real"]


def test_a_first_reading_dated_back_does_not_make_a_node_known() -> None:
    """An invented node whose first reading claims to be an hour old is aged from no earlier than 120 s before the
    worker's clock, not from the date it claims. Found in review: clamped by the partition's event time instead, a
    partition holding only the attacker's records let it claim the hour."""
    now = time.time_ns()
    gpus = Partition("telemetry.gpu", clock_ns=lambda: now)
    gpus.publish([gpu_health(node="ghost", ts_ns=now - 3600 * S)])
    out = gpus.publish([gpu_health(node="ghost", ts_ns=now + S, lost=True, xid=79)])
    assert _drains(out) == [] and "had reported for 121 s" in _detail(out)


def test_invented_names_cannot_grow_the_state_past_its_cap_and_a_known_node_is_still_watched() -> None:
    """Before: 600 invented node names took a worker from 122 to 422 MB, kept for the detectors' 24 h. Now a
    partition keeps at most CLOCKTOWER_STREAMS_MAX_ENTRIES per processor; new keys past it are refused and counted,
    and keys kept before the flood are still updated."""
    from prometheus_client import REGISTRY

    now = time.time_ns()
    wall = [now - 600 * S]
    gpus = Partition("telemetry.gpu", clock_ns=lambda: wall[0])
    store = gpus.handler.router.runners["gpu_fault"].store
    store.max_entries = 40
    gpus.publish([gpu_health(node="real", ts_ns=now - 600 * S)])
    wall[0] = now
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
    # the worker's own tables use them: tests/test_streams_app.py


def test_a_port_kept_before_the_cap_filled_still_gets_its_watchdog() -> None:
    """Found in review: once a partition held CLOCKTOWER_STREAMS_MAX_ENTRIES, the watchdog timer of a port kept
    before the flood was refused too, so a port that reports only on change never failed over. Timers of kept
    ports are now never refused, and a new port past the cap is not watched at all (counted)."""
    links = Partition("telemetry.links")
    runner = links.handler.router.runners["link_flap"]
    runner.store.max_entries = 31
    wall = [0.0]
    runner.clock.wall = lambda: wall[0]      # the partition clock's wall: the silent real node stops holding it
    now = time.time_ns() - 600 * S
    links.publish([link_state(node="real", ts_ns=now, backup="eth1")])
    for i in range(30):
        links.publish([link_state(node=f"other-{i}", ts_ns=now, backup="eth1")])
    for i in range(20):
        assert links.publish([link_state(node=f"ghost-{i}", ts_ns=now, up=False, carrier_changes=1,
                                         backup="eth1")]) == []
    assert runner.processor.counters()["unwatched"] == 20 and runner.store.entries[0] == 31
    links.publish([link_state(node="real", ts_ns=now + 2 * S, up=False, carrier_changes=1, backup="eth1")])
    wall[0] += 61
    fired: list[Event] = []
    for k in range(3, 6):
        for i in range(30):
            fired += links.publish([link_state(node=f"other-{i}", ts_ns=now + k * S, backup="eth1")])
    assert [(e.node, e.action) for e in fired if hasattr(e, "action")] == [("real", "failover")]


def test_a_copy_of_a_10_hz_gpu_reading_from_seconds_ago_changes_nothing() -> None:
    """Found in a second review: the agent reads each GPU 10 times a second, so the 64 times kept covered 6.4 s, and
    a copy of a throttled reading 39 s old re-opened a thermal incident and rolled the ECC count back (the next real
    reading then opened a false `gpu_ecc`). Once the memory is full, anything older than all of it is stale."""
    gpus = Partition("telemetry.gpu")
    now = time.time_ns() - 100 * S
    gpus.publish([gpu_health(ts_ns=now, ecc_uncorrected=0)])
    hot, t = 0, now
    for i in range(1, 400):            # 40 s at 10 Hz: hot at 1 s, cool after, 2 uncorrectable ECC errors at 5 s
        t = now + i * S // 10
        gpus.publish([gpu_health(ts_ns=t, ecc_uncorrected=0 if i < 50 else 2,
                                 **({"throttle_reasons": 0x40} if i == 10 else {}))])
        hot = hot or (len(gpus.records) - 1 if i == 10 else 0)
    assert [e for e in gpus.copy(hot) if isinstance(e, Incident)] == []
    after = gpus.publish([gpu_health(ts_ns=t + S // 10, ecc_uncorrected=2)])
    assert [e for e in after if isinstance(e, Incident)] == []


def test_a_copy_of_a_link_report_of_a_minute_of_flaps_does_not_quarantine() -> None:
    """Found in a second review: a link reported every second plus once per change made 70 reports in a minute of
    5 flaps; a copy of its first "down" (58 s old) was applied, rolled the carrier counter back, and the next real
    report counted the whole burst again: quarantine."""
    links = Partition("telemetry.links")
    t0 = time.time_ns() - 3000 * S
    up, changes, down = True, 0, 0
    for sec in range(60):
        links.publish([link_state(backup="eth1", ts_ns=t0 + sec * S, up=up, carrier_changes=changes)])
        if sec < 10:
            up, changes = not up, changes + 1
            links.publish([link_state(backup="eth1", ts_ns=t0 + sec * S + S // 2, up=up, carrier_changes=changes)])
            down = down or (len(links.records) - 1 if not up else 0)
    after = links.copy(down)
    for k in range(1, 4):
        after += links.publish([link_state(backup="eth1", ts_ns=t0 + (59 + k) * S, carrier_changes=changes)])
    assert [e.action for e in after if hasattr(e, "action")] == []
