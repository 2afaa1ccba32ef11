"""The GPU detector reads faults by meaning: the XID catalogue, one incident per fault, repeats, recovery, heat."""

from __future__ import annotations

import orjson
import pytest

from clocktower.schemas.control import ReplacementRequest
from clocktower.streams.detectors.gpu_fault import GpuFaultDetector
from clocktower.streams.detectors.xid_catalogue import CATALOGUE, meaning_of
from tests.test_detectors import T0, Fed, gpu

S = 10**9
MS = 10**6


def rows(out: list) -> list[tuple[str, str, str]]:
    return [(o.kind, o.state, o.severity) for o in out if not isinstance(o, ReplacementRequest)]


@pytest.mark.parametrize("xid", [13, 31, 43, 45])
def test_application_xids_open_no_hardware_incident(xid: int) -> None:
    det = Fed(GpuFaultDetector())
    det(gpu(T0))
    assert det(gpu(T0 + S, xid=xid)) == []
    assert det.proc.counters()["application_xids"] == 1


def test_the_catalogue_names_every_xid_the_issue_lists() -> None:
    expected = {48: ("memory", "gpu_ecc"), 63: ("memory", "gpu_ecc"), 64: ("memory", "gpu_ecc"),
                74: ("nvlink", "gpu_xid"), 79: ("bus", "gpu_xid"), 92: ("memory", "gpu_ecc"),
                94: ("memory", "gpu_ecc"), 95: ("memory", "gpu_ecc"), 119: ("gsp", "gpu_xid"),
                120: ("gsp", "gpu_xid")}
    assert {x: (CATALOGUE[x].fault, CATALOGUE[x].kind) for x in expected} == expected
    assert CATALOGUE[95].severity == "critical" and CATALOGUE[94].severity == "warning"
    assert meaning_of(999).fault == "unknown" and "999" in meaning_of(999).meaning


def test_a_memory_fault_is_one_incident_and_its_repeats_are_counted() -> None:
    det = Fed(GpuFaultDetector())
    det(gpu(T0))
    (opened,) = det(gpu(T0 + S, xid=48, ecc_uncorrected=1))   # the XID and the ECC rise: one fault, one row
    assert (opened.kind, opened.state, opened.severity) == ("gpu_ecc", "open", "critical")
    assert "XID 48" in opened.detail and "0 -> 1" in opened.detail and "recommended: reset_gpu" in opened.detail
    assert orjson.loads(opened.evidence)["count"] == 1
    (again,) = det(gpu(T0 + 2 * S, xid=63, ecc_uncorrected=1))
    assert (again.incident_id, again.state, again.severity) == (opened.incident_id, "update", "critical")
    assert "repeat: 2" in again.detail and orjson.loads(again.evidence)["xid"] == 63
    (third,) = det(gpu(T0 + 3 * S, ecc_uncorrected=2))   # the count rises again without an XID
    assert third.incident_id == opened.incident_id and "repeat: 3" in third.detail


def test_a_fault_resolves_after_a_quiet_stretch_and_its_count_starts_again() -> None:
    det = Fed(GpuFaultDetector(quiet_ns=10 * S))
    (first,) = det(gpu(T0, xid=74))
    assert first.kind == "gpu_xid" and "NVLink" in first.detail and "check_link" in first.detail
    assert rows(det(gpu(T0 + 5 * S, xid=74))) == [("gpu_xid", "update", "critical")]
    assert det(gpu(T0 + 14 * S)) == []                      # 9 s since the repeat: not yet
    (done,) = det(gpu(T0 + 15 * S))
    assert (done.state, done.incident_id) == ("resolve", first.incident_id) and "2 seen, count reset" in done.detail
    (new,) = det(gpu(T0 + 16 * S, xid=74))
    assert new.state == "open" and new.incident_id != first.incident_id and orjson.loads(new.evidence)["count"] == 1


def test_an_unknown_xid_is_a_warning_that_names_it() -> None:
    det = Fed(GpuFaultDetector())
    (inc,) = det(gpu(T0, xid=150))
    assert (inc.kind, inc.severity) == ("gpu_xid", "warning") and "XID 150" in inc.detail


def test_a_lost_gpu_asks_once_and_resolves_when_it_answers_again() -> None:
    det = Fed(GpuFaultDetector(quiet_ns=10 * S))
    det(gpu(T0))
    lost = {"lost": True, "temperature_c": None, "throttle_reasons": None, "ecc_uncorrected": None}
    inc, req = det(gpu(T0 + S, **lost))
    assert (inc.kind, inc.state) == ("gpu_lost", "open") and isinstance(req, ReplacementRequest)
    for i in range(2, 20):   # still lost: nothing more, and it never resolves while lost
        assert det(gpu(T0 + i * S, **lost)) == []
    assert det(gpu(T0 + 20 * S)) == []                       # answers again: quiet counts from the last lost reading
    (back,) = det(gpu(T0 + 29 * S))
    assert (back.state, back.incident_id) == ("resolve", inc.incident_id)
    inc2, req2 = det(gpu(T0 + 30 * S, **lost))                 # lost again: a new incident, a new request
    assert inc2.incident_id != inc.incident_id and req2.incident_id == inc2.incident_id


def test_xid79_then_lost_readings_are_one_incident() -> None:
    det = Fed(GpuFaultDetector())
    inc, _ = det(gpu(T0, xid=79))
    assert inc.kind == "gpu_xid" and "fallen off the bus" in inc.detail
    lost = {"lost": True, "temperature_c": None, "throttle_reasons": None, "ecc_uncorrected": None}
    assert [det(gpu(T0 + i * 100 * MS, **lost)) for i in range(1, 5)] == [[]] * 4


def test_a_power_cap_is_not_a_fault() -> None:
    det = Fed(GpuFaultDetector())
    for i in range(20):   # 2 s capped at 0x04 (SW power cap), clocks down, 70 C
        assert det(gpu(T0 + i * 100 * MS, throttle_reasons=0x04, sm_clock_mhz=1500, temperature_c=70.0)) == []


def test_a_hot_gpu_warns_before_the_throttle_and_is_one_incident() -> None:
    """Two readings at or above 85 C (a slow climb, 1 s apart) warn; throttling held 0.5 s makes it critical."""
    det = Fed(GpuFaultDetector())
    temps = [70.0, 78.0, 84.0, 86.0]
    assert [det(gpu(T0 + i * S, temperature_c=t)) for i, t in enumerate(temps)] == [[]] * 4   # one at 85+: not yet
    (warn,) = det(gpu(T0 + 4 * S, temperature_c=87.5))
    assert (warn.kind, warn.state, warn.severity) == ("gpu_thermal", "open", "warning")
    assert "early warning" in warn.detail and "at or above 85 C" in warn.detail
    assert orjson.loads(warn.evidence)["throttle_reasons"] == 0
    t = T0 + 4 * S
    hot = {"throttle_reasons": 0x40, "temperature_c": 88.0}
    assert det(gpu(t + 100 * MS, **hot)) == []                    # throttled, not yet for sustain_ns
    assert det(gpu(t + 500 * MS, **hot)) == []
    (crit,) = det(gpu(t + 600 * MS, **hot))
    assert (crit.incident_id, crit.state, crit.severity) == (warn.incident_id, "update", "critical")
    assert det(gpu(t + 700 * MS, **hot)) == []
    assert det(gpu(t + 1700 * MS, temperature_c=83.0)) == []      # unthrottled but not cool: 83 > 85 - 3
    assert det(gpu(t + 2700 * MS, temperature_c=80.0)) == []
    (done,) = det(gpu(t + 3700 * MS, temperature_c=79.0))
    assert (done.state, done.incident_id) == ("resolve", warn.incident_id)


def test_a_fast_climb_warns_below_85_c() -> None:
    """65 -> 82 C in 0.3 s: climbing fast toward the threshold is the early warning, before 85 C."""
    det = Fed(GpuFaultDetector())
    out = [det(gpu(T0 + i * 100 * MS, temperature_c=t)) for i, t in enumerate([64.0, 65.0, 70.0, 76.0, 82.0])]
    warned = [i for i, o in enumerate(out) if o]
    assert warned and warned[0] >= 3                               # not below 75 C
    (warn,) = out[warned[0]]
    assert "climbing" in warn.detail and orjson.loads(warn.evidence)["slope_c_per_s"] >= 5


def test_temperature_swings_of_a_healthy_gpu_warn_of_nothing() -> None:
    """The compute/idle swing (a few C within seconds) around 65-72 C never warns."""
    det = Fed(GpuFaultDetector())
    for i in range(300):
        temp = 68.0 + 3.5 * ((i // 5) % 2) + 0.15 * ((i * 7) % 3 - 1)
        assert det(gpu(T0 + i * 100 * MS, temperature_c=temp)) == []


def test_a_single_warm_reading_or_a_throttle_blip_opens_nothing() -> None:
    det = Fed(GpuFaultDetector())
    assert det(gpu(T0, temperature_c=86.0)) == []
    assert det(gpu(T0 + 100 * MS, temperature_c=80.0)) == []
    assert det(gpu(T0 + 200 * MS, throttle_reasons=0x20)) == []
    assert det(gpu(T0 + 300 * MS)) == []
    assert det(gpu(T0 + 800 * MS, throttle_reasons=0x20)) == []   # throttled again: the stretch starts again
