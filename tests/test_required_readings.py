"""A missing reading is a dead letter, never a stored 0 (issue 9 item 7: a 5-field gpu_health stored power_w 0.0)."""

from __future__ import annotations

import base64
from collections.abc import Callable

import orjson
import pytest

from clocktower.schemas.codec import H_COUNT, H_SCHEMA, H_VERSION, DecodeError, dead_letter, decode_batch
from clocktower.schemas.telemetry import GpuHealth
from clocktower.streams.detectors.gpu_fault import GpuFaultDetector
from clocktower.streams.state_store import StateStore
from tests.event_samples import SAMPLES

GPU = "telemetry.gpu"


def _record(*events: dict, schema: str = "gpu_health", version: int = 1) -> tuple[bytes, bytes, list]:
    headers = [(H_SCHEMA, schema.encode()), (H_VERSION, str(version).encode()), (H_COUNT, str(len(events)).encode())]
    return events[0]["node"].encode(), orjson.dumps(list(events)), headers


def test_the_five_field_gpu_health_is_a_dead_letter_naming_the_missing_readings() -> None:
    five = {"node": "node-0", "ts_ns": SAMPLES["gpu_health"]["ts_ns"], "gpu": 0, "uuid": "GPU-0", "xid": 0}
    with pytest.raises(DecodeError) as err:
        decode_batch(GPU, *_record(five))
    assert "missing" in str(err.value) and "Field required" in str(err.value) and "0.lost" in str(err.value)
    key, value, _ = _record(five)
    dead = dead_letter(GPU, 0, 5, key, value, str(err.value), "sink")   # what the sink stores for it
    assert (dead.origin_topic, dead.origin_offset, dead.raw_b64) == (GPU, 5, base64.b64encode(value).decode())
    assert "Field required" in dead.reason and "(+18 more)" in dead.reason   # every missing reading counted


@pytest.mark.parametrize("field", ["power_w", "temperature_c", "ecc_uncorrected", "lost", "nvlink_errors"])
def test_a_gpu_reading_missing_one_field_is_refused_with_its_name(field: str) -> None:
    event = {k: v for k, v in SAMPLES["gpu_health"].items() if k != field}
    with pytest.raises(DecodeError, match=rf"invalid missing at 0\.{field}: Field required"):
        decode_batch(GPU, *_record(event))


def test_zero_and_null_are_both_real_values() -> None:
    """A 0 W reading is kept as 0; an unsupported one (null) as None; old complete records decode as before."""
    zero = {**SAMPLES["gpu_health"], "power_w": 0.0}
    unread = {**SAMPLES["gpu_health"], "power_w": None, "ecc_corrected": None}
    events = decode_batch(GPU, *_record(zero, unread)).events
    assert [(e.power_w, e.ecc_corrected) for e in events] == [(0.0, 0), (None, None)]
    assert events == [GpuHealth(**zero), GpuHealth(**unread)]


@pytest.mark.parametrize(("sample", "field", "why"), [
    ("link_state", "speed_mbps", "Field required"),
    ("link_state", "carrier", "Field required"),
    ("link_state/infiniband", "port_rcv_data", "required when kind is 'infiniband'"),
    ("flow_sample", "retransmits", "Field required"),
    ("flow_counters", "retransmits", "required when source is 'sock'"),
    ("flow_counters/tc", "packets", "required when source is 'tc'"),
    ("flow_latency", "corrected_latency_ns", "Field required"),
])
def test_other_measurements_are_required_where_they_apply(sample: str, field: str, why: str) -> None:
    schema = sample.split("/")[0]
    topic = {"link_state": "telemetry.links", "flow_sample": "telemetry.flows", "flow_counters":
             "telemetry.flowcounters", "flow_latency": "analytics.flow_latency"}[schema]
    event = {k: v for k, v in SAMPLES[sample].items() if k != field}
    with pytest.raises(DecodeError, match=why):
        decode_batch(topic, *_record(event, schema=schema))


def test_fields_that_do_not_apply_keep_their_default() -> None:
    """An Ethernet port has no IB counters, a socket no packets, a classifier no retransmits: 0, not an error."""
    eth = decode_batch("telemetry.links", *_record(SAMPLES["link_state"], schema="link_state")).events[0]
    assert (eth.ib_state, eth.port_rcv_data) == ("none", 0)
    sock = decode_batch("telemetry.flowcounters", *_record(SAMPLES["flow_counters"], schema="flow_counters"))
    tc = decode_batch("telemetry.flowcounters", *_record(SAMPLES["flow_counters/tc"], schema="flow_counters"))
    assert (sock.events[0].packets, sock.events[0].interface, tc.events[0].retransmits) == (0, "", 0)


def _detector() -> Callable[[GpuHealth], list]:
    """The GPU detector fed one reading per batch, returning its unsigned outputs."""
    det = GpuFaultDetector()
    store = StateStore(det)

    def feed(e: GpuHealth) -> list:
        out = det.process(store, e)
        store.flush()
        return out
    return feed


def test_gpu_detector_reads_null_as_unknown() -> None:
    """Null ECC and throttle readings open nothing and close nothing; a lost GPU (all null) still drains."""
    det = _detector()
    first = GpuHealth(**{**SAMPLES["gpu_health"], "throttle_reasons": 0x40, "temperature_c": None})
    assert det(first) == []       # throttled, not yet for long enough
    hot = first.model_copy(update={"ts_ns": first.ts_ns + 500_000_000})
    [opened] = det(hot)
    assert (opened.kind, opened.state) == ("gpu_thermal", "open")
    assert opened.detail.startswith("thermal slowdown for 500 ms: throttle reasons 0x40, temperature unknown")
    unread = GpuHealth(**{**SAMPLES["gpu_health"], "ts_ns": hot.ts_ns + 1, "throttle_reasons": None,
                          "ecc_uncorrected": None})
    assert det(unread) == []      # throttling not known to have cleared: still open
    lost = det(GpuHealth(**{**SAMPLES["gpu_health/lost"], "ts_ns": hot.ts_ns + 2}))
    kinds = sorted((type(e).__name__, getattr(e, "kind", getattr(e, "reason", ""))) for e in lost)
    assert kinds == [("Incident", "gpu_xid"), ("ReplacementRequest", "gpu_xid")]   # the allocator drains


def test_a_null_first_ecc_reading_is_no_baseline() -> None:
    """The first known ECC count is the baseline (no incident); only a rise from a known count opens one."""
    det = _detector()
    base = SAMPLES["gpu_health"]

    def read(dt: int, ecc: int | None) -> list:
        return det(GpuHealth(**{**base, "ts_ns": base["ts_ns"] + dt, "ecc_uncorrected": ecc,
                                "throttle_reasons": 0, "xid": 0, "lost": False}))

    assert read(0, None) == []
    assert read(1, 7) == []                   # first known count: errors since driver load, not new ones
    assert read(2, None) == []
    [ecc] = read(3, 9)
    assert (ecc.kind, ecc.detail) == ("gpu_ecc", "uncorrectable ECC errors 7 -> 9; recommended: reset_gpu")
    [reset] = read(4, 0)                      # driver reloaded: the counter restarts, a new baseline, and the
    assert (reset.state, reset.incident_id) == ("resolve", ecc.incident_id)   # fault's count with it
    [again] = read(5, 1)
    assert (again.state, again.detail) == ("open", "uncorrectable ECC errors 0 -> 1; recommended: reset_gpu")
