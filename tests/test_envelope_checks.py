"""What a third-party producer's records must pass (count header, key, event time) and how batches are cut to size."""

from __future__ import annotations

from typing import get_args

import orjson
import pytest

from clocktower.config import Settings
from clocktower.schemas.batch_split import encode_records
from clocktower.schemas.codec import H_COUNT, DecodeError, decode_batch, encode_batch
from clocktower.schemas.control import Action, ControlCommand
from clocktower.schemas.operations import DeadLetter
from clocktower.schemas.telemetry import ClockProbe, LinkState
from clocktower.schemas.topics import MAX_RECORD_BYTES, topic_for
from tests.control_keys import TEST_SIGNER

NOW = 1_780_000_000 * 10**9
HOUR = 3600 * 10**9
DAY = 24 * HOUR
ACTION = get_args(Action)[0]


def _link(i: int = 0, node: str = "node-0", ts_ns: int = NOW) -> LinkState:
    return LinkState(node=node, ts_ns=ts_ns, interface=f"eth{i}", kind="ethernet", up=True, carrier_changes=i,
                     speed_mbps=400_000, operstate="up", carrier=True)


def _decode(key, value, headers, topic="telemetry.links", **kw):  # noqa: ANN001, ANN202
    return decode_batch(topic, key, value, headers, now_ns=NOW, **kw)


def _with_count(headers, count: bytes | None):  # noqa: ANN001, ANN202
    return [(k, v) for k, v in headers if k != H_COUNT] + ([(H_COUNT, count)] if count is not None else [])


# --- ct-count -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("count", [b"2", b"4", b"0", b"-3", b"3.0", b" 3", b"three", b"\xff", None])
def test_count_header_must_match_the_events(count: bytes | None) -> None:
    key, value, headers = encode_batch([_link(i) for i in range(3)])
    with pytest.raises(DecodeError, match="ct-count"):
        _decode(key, value, _with_count(headers, count))


def test_count_header_matching_passes() -> None:
    key, value, headers = encode_batch([_link(i) for i in range(3)])
    assert len(_decode(key, value, _with_count(headers, b"3")).events) == 3


# --- key --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("key", [None, b""])
def test_keyless_record_is_refused(key: bytes | None) -> None:
    _, value, headers = encode_batch([_link()])
    with pytest.raises(DecodeError, match="no key"):
        _decode(key, value, headers)


# --- event time ---------------------------------------------------------------------------------------------------
SKEW = 30 * 10**9   # the default: node clocks must agree within 30 s (issue 18: a day let future readings blind)


@pytest.mark.parametrize(("ahead", "ok"), [(0, True), (SKEW - 1, True), (SKEW + 1, False), (23 * HOUR, False),
                                           (365 * DAY, False)])
def test_future_ts_ns_is_refused_beyond_the_default_skew(ahead: int, ok: bool) -> None:
    key, value, headers = encode_batch([_link(0), _link(1, ts_ns=NOW + ahead)])
    if ok:
        assert _decode(key, value, headers).events[1].ts_ns == NOW + ahead
    else:
        with pytest.raises(DecodeError, match=r"event 1: ts_ns .* ahead of the decoder's clock"):
            _decode(key, value, headers)


def test_skew_is_configurable() -> None:
    key, value, headers = encode_batch([_link(ts_ns=NOW + HOUR)])
    with pytest.raises(DecodeError, match="ahead"):
        _decode(key, value, headers, max_future_skew_ns=60 * 10**9)
    assert _decode(key, value, headers, max_future_skew_ns=2 * HOUR).events


def test_default_clock_is_the_wall_clock() -> None:
    import time

    key, value, headers = encode_batch([_link(ts_ns=time.time_ns() + 365 * DAY)])
    with pytest.raises(DecodeError, match="ahead"):
        decode_batch("telemetry.links", key, value, headers)


def test_telemetry_checks_every_timestamp_field() -> None:
    probe = ClockProbe(node="n", ts_ns=NOW, pair_id=1, idx=0, sender="m", receiver="n", tx_ns=NOW + 365 * DAY,
                       rx_ns=NOW)
    key, value, headers = encode_batch([probe])
    with pytest.raises(DecodeError, match="event 0: tx_ns"):
        _decode(key, value, headers, topic="telemetry.clock")


def test_control_command_expiry_may_be_in_the_future() -> None:
    cmd = ControlCommand(node="n", ts_ns=NOW, command_id="c1", action=ACTION, target="n", expires_ns=NOW + 30 * DAY,
                         signature="s")
    key, value, headers = encode_batch([cmd])
    assert _decode(key, value, headers, topic="control.commands").events == [cmd]
    late = cmd.model_copy(update={"ts_ns": NOW + 30 * DAY})
    with pytest.raises(DecodeError, match="event 0: ts_ns"):
        _decode(*encode_batch([late]), topic="control.commands")


def test_skew_setting_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CLOCKTOWER_MAX_FUTURE_SKEW_S", raising=False)
    assert Settings().max_future_skew_ns == SKEW
    monkeypatch.setenv("CLOCKTOWER_MAX_FUTURE_SKEW_S", "90")
    assert Settings().max_future_skew_ns == 90 * 10**9


# --- cutting batches to size ----------------------------------------------------------------------------------------
def test_big_batch_is_cut_into_decodable_records_in_order() -> None:
    events = [_link(i) for i in range(200)]
    size = len(encode_batch(events)[1])
    split = encode_records(events, max_bytes=size // 5)
    assert len(split.records) >= 5 and not split.oversized
    decoded = []
    for r in split.records:
        assert len(r.value) <= size // 5
        batch = _decode(r.key, r.value, r.headers)
        assert len(batch.events) == r.events
        decoded += batch.events
    assert decoded == events


def test_events_of_mixed_sizes_all_fit() -> None:
    big = "x" * 3000
    events = [DeadLetter(node="n", ts_ns=NOW, origin_topic="t", origin_partition=0, origin_offset=i, reason="r",
                         detector="d", raw_b64=big if i % 7 == 0 else "") for i in range(100)]
    split = encode_records(events, max_bytes=8000)
    assert not split.oversized
    assert all(len(r.value) <= 8000 for r in split.records)
    out = [e for r in split.records for e in decode_batch("deadletter", r.key, r.value, r.headers, now_ns=NOW).events]
    assert out == events


def test_an_event_too_big_alone_is_returned_apart_not_dropped() -> None:
    events = [DeadLetter(node="n", ts_ns=NOW, origin_topic="t", origin_partition=0, origin_offset=i, reason="r",
                         detector="d", raw_b64="x" * (5000 if i == 2 else 10)) for i in range(5)]
    split = encode_records(events, max_bytes=2000)
    assert [e for e, _ in split.oversized] == [events[2]] and split.oversized[0][1] > 2000
    kept = [e for r in split.records for e in orjson.loads(r.value)]
    assert [e["origin_offset"] for e in kept] == [0, 1, 3, 4]


def test_a_batch_within_the_limit_stays_one_record() -> None:
    events = [_link(i) for i in range(1000)]
    split = encode_records(events)
    assert len(split.records) == 1 and split.records[0].value == encode_batch(events)[1]


def test_2_45_mib_of_events_make_several_records_within_the_limit() -> None:
    pad = "y" * 1000
    events = [DeadLetter(node="n", ts_ns=NOW, origin_topic="t", origin_partition=0, origin_offset=i, reason=pad,
                         detector="d", raw_b64="") for i in range(2400)]
    assert len(encode_batch(events)[1]) > 2.45 * 2**20
    split = encode_records(events)
    assert len(split.records) >= 3 and all(len(r.value) <= MAX_RECORD_BYTES for r in split.records)
    assert sum(r.events for r in split.records) == len(events)
    assert topic_for(DeadLetter).name == "deadletter"


def test_streams_handler_decodes_with_its_configured_skew() -> None:
    import time

    from prometheus_client import REGISTRY

    from clocktower.streams.processors import Processors
    from clocktower.streams.record_handler import RecordHandler

    def failures() -> float:
        return REGISTRY.get_sample_value("clocktower_streams_decode_failures_total", {"topic": "telemetry.links"}) or 0

    k, v, h = encode_batch([_link(ts_ns=time.time_ns() + 10 * 10**9)])
    before = failures()
    RecordHandler(Processors(TEST_SIGNER)).handle("telemetry.links", 0, 1, k, v, h)   # default: 30 s
    assert failures() == before
    assert RecordHandler(Processors(TEST_SIGNER), max_future_skew_ns=5 * 10**9).handle(
        "telemetry.links", 0, 2, k, v, h) == []
    assert failures() == before + 1


def test_streams_outputs_are_cut_to_the_record_limit() -> None:
    from clocktower.schemas.analytics import Incident, IncidentKind
    from clocktower.streams.emit import records

    kind = get_args(IncidentKind)[0]
    incidents = [Incident(node="n", ts_ns=NOW + i, incident_id=f"i{i}", kind=kind, state="open", severity="info",
                          target="t", opened_ns=NOW, detail="d" * 60_000) for i in range(40)]   # 2.3 MiB
    out = list(records(incidents))
    assert len(out) >= 3 and all(len(v) <= MAX_RECORD_BYTES for _, _, v, _, _ in out)
    assert [e for t, k, v, h, _ in out for e in _decode(k, v, h, topic=t).events] == incidents


def test_a_repartition_part_is_one_record_whatever_its_nodes_and_only_the_internal_handler_reads_it() -> None:
    """A node's records carry one node; the streams' regrouped part of many nodes goes out as one record (a
    record per node made 15 small records of a 15-node fleet's part), which the repartition topic's handler reads
    and a telemetry topic's handler refuses."""
    from clocktower.streams.emit import records
    from clocktower.streams.record_handler import RecordHandler

    events = [_link(i, node=f"n{i % 3}") for i in range(9)]
    assert len(list(records(events))) == 3, "to their own topic: a record per node"
    out = list(records(events, topic="clocktower-streams-x-repartition", partition=1, regrouped=True))
    assert len(out) == 1 and out[0].partition == 1
    _, k, v, h, _ = out[0]
    assert [e.interface for e in decode_batch("telemetry.links", k, v, h, now_ns=NOW, mixed_nodes=True).events] \
        == [f"eth{i}" for i in range(9)], "one record, in their order"

    class Seen:
        budget = type("B", (), {"withheld": 0})()

        def __init__(self) -> None:
            self.events: list = []

        def route(self, topic, partition, events, failures, offset):  # noqa: ANN001, ANN201
            self.events += events
            return []

    internal, external = Seen(), Seen()
    RecordHandler(internal, internal=True).handle("clocktower-streams-x-repartition", 1, 0, k, v, h)
    RecordHandler(external).handle("telemetry.links", 1, 0, k, v, h)
    assert len(internal.events) == 9 and external.events == []
