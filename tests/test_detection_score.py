"""The detection scorer: which incident detects which injected fault, and the figures it makes of them."""

from __future__ import annotations

from clocktower.detection_score import EARLY_NS, LATE_NS, Scorer, first_rows
from clocktower.schemas.analytics import Incident
from clocktower.schemas.operations import InjectedFault

S = 10**9
T0 = 1_780_000_000 * S


def fault(kind: str, target: str, start: int, end: int, node: str = "n1") -> InjectedFault:
    return InjectedFault(node=node, ts_ns=start, fault_id=f"{kind}-{start}", kind=kind, target=target,
                         start_ns=start, end_ns=end)


def inc(kind: str, target: str, ts: int, iid: str, state: str = "open", node: str = "n1") -> Incident:
    return Incident(node=node, ts_ns=ts, incident_id=iid, kind=kind, state=state, severity="warning",
                    target=target, opened_ns=ts)


def same_clock(node: str, ns: int) -> int:
    return ns


def test_an_incident_on_the_faults_target_in_its_window_detects_it() -> None:
    s = Scorer()
    faults = [fault("gpu_thermal", "n1:gpu3", T0, T0 + 5 * S), fault("straggler", "job:rank9", T0 + 10 * S,
                                                                        T0 + 12 * S)]
    incidents = [inc("gpu_thermal", "n1/gpu3", T0 + S // 2, "a"), inc("gpu_thermal", "n1/gpu3", T0 + S, "a", "update"),
                 inc("gpu_thermal", "n1/gpu3", T0 + 6 * S, "a", "resolve"),
                 inc("straggler", "job:rank8", T0 + 10 * S, "b"),                        # the wrong rank
                 inc("straggler", "job:rank9", T0 + 12 * S + LATE_NS + 1, "c")]          # too late
    s.add_run(faults, incidents, same_clock)
    r = s.report()
    assert r["kinds"]["gpu_thermal"] == {"faults": 1, "detected": 1, "incidents": 1, "precision": 1.0, "recall": 1.0,
                                         "latency_ms_p50": 500.0, "latency_ms_p95": 500.0}
    assert (r["kinds"]["straggler"]["recall"], r["kinds"]["straggler"]["precision"]) == (0.0, 0.0)
    assert (r["recall"], r["precision"]) == (0.5, round(1 / 3, 4)) and len(r["false_positives"]) == 2


def test_a_kind_change_and_an_early_warning_count_once() -> None:
    s = Scorer()
    s.add_run([fault("link_flap", "n1:eth0", T0, T0 + 2 * S)],
              [inc("link_down", "n1/eth0", T0 - EARLY_NS, "x"), inc("link_flap", "n1/eth0", T0 + S, "x", "update")],
              same_clock)
    k = s.report()["kinds"]["link_flap"]
    assert (k["detected"], k["incidents"], k["latency_ms_p50"]) == (1, 1, 0.0)
    rows = first_rows([inc("link_flap", "t", T0 + 5, "y", "update"), inc("link_down", "t", T0 + 3, "y")])
    assert [i.state for i in rows] == ["open"]


def test_every_incident_of_a_fault_free_run_is_counted() -> None:
    s = Scorer()
    s.add_run([], [inc("gpu_thermal", "n1/gpu0", T0, "z"), inc("gpu_thermal", "n1/gpu0", T0 + S, "z", "update")],
              same_clock)
    r = s.report()
    assert (r["fault_free_runs"], r["fault_free_incidents"], r["kinds"]["gpu_thermal"]["precision"]) == (1, 1, 0.0)


def test_timestamps_are_read_on_true_time() -> None:
    s = Scorer()
    s.add_run([fault("gpu_xid", "n1:gpu5", T0, T0)], [inc("gpu_xid", "n1/gpu5", T0 + 3 * S + 40_000_000, "q")],
              lambda node, ns: ns - 3 * S)   # the node's clock runs 3 s ahead
    assert s.report()["kinds"]["gpu_xid"]["latency_ms_p50"] == 40.0
