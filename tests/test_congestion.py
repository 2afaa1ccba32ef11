"""Congestion from one-way delay: the per-class queueing budget, and the detector's incidents."""

from __future__ import annotations

import random

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from clocktower.control.intent import CommandIntent, command_id_of
from clocktower.schemas.analytics import FlowLatency, Incident
from clocktower.streams.detectors.congestion import CongestionDetector
from clocktower.streams.detectors.delay_budget import WINDOW_NS, DelayRule, LinkDelay, observe
from clocktower.streams.state_store import StateStore
from tests.test_detectors import Fed

T0 = 1_780_000_000 * 10**9
US = 1_000
MS = 1_000_000
S = 10**9
RULE = DelayRule()


def healthy(rng: random.Random) -> int:
    """The simulator's healthy link: 5 us, |N(0, 0.3 us)| jitter, exponential queueing of mean 0.8 us."""
    return 5 * US + int(abs(rng.gauss(0, 300)) + rng.expovariate(1 / 800))


def run(link: LinkDelay, samples: int, delay, t0: int = T0, step: int = MS, priority: int = 3) -> list:
    return [c for i in range(samples) if (c := observe(link, t0 + i * step, delay(i), priority, RULE))]


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_a_healthy_link_is_never_congested(seed: int) -> None:
    rng = random.Random(seed)
    assert run(LinkDelay(), 5_000, lambda i: healthy(rng)) == []


def test_queueing_over_the_high_budget_opens_within_sustain_samples_and_clears_with_hysteresis() -> None:
    rng = random.Random(1)
    link = LinkDelay()
    run(link, 1_000, lambda i: healthy(rng))
    changes = run(link, 100, lambda i: healthy(rng) + rng.randint(50 * US, 500 * US), t0=T0 + 1_000 * MS)
    [opened] = changes
    assert (opened.klass, opened.opened, opened.budget_ns) == ("high", True, RULE.high_budget_ns)
    assert 5 * US <= opened.baseline_ns <= 6 * US and opened.queue_ns > RULE.high_budget_ns
    cleared = run(link, 200, lambda i: healthy(rng), t0=T0 + 1_100 * MS)
    assert [(c.klass, c.opened) for c in cleared] == [("high", False)]


def test_the_low_class_has_its_own_larger_budget() -> None:
    link = LinkDelay()
    run(link, 100, lambda i: 5 * US, priority=0)
    assert run(link, 100, lambda i: 105 * US, t0=T0 + 100 * MS, priority=0) == []        # 100 us: under 250
    [c] = run(link, 100, lambda i: 405 * US, t0=T0 + 200 * MS, priority=0)
    assert (c.klass, c.opened) == ("low", True)


def test_a_congestion_longer_than_the_window_does_not_become_the_floor() -> None:
    link = LinkDelay()
    run(link, 100, lambda i: 5 * US, step=10 * MS)
    [opened] = run(link, 2 * WINDOW_NS // (100 * MS), lambda i: 300 * US, t0=T0 + 10**9, step=100 * MS)
    assert opened.opened and link.baseline() == 5 * US and link.congested["high"]


def row(ts: int, delay: int | None, src: str = "a", dst: str = "b", seq: int = 0, priority: int = 3) -> FlowLatency:
    return FlowLatency(node=dst, ts_ns=ts, src_node=src, src_ip="10.0.0.1", dst_ip="10.0.0.2", src_port=40000,
                       dst_port=4791, proto="roce", seq=seq, bytes=4096, tx_ns=ts - 5 * US, rx_ns=ts,
                       latency_ns=5 * US, clock_corrected=delay is not None, corrected_latency_ns=delay,
                       error_bound_ns=None if delay is None else 50, priority=priority)


def test_the_detector_opens_and_resolves_one_incident_per_link_and_class_and_slows_the_low_class() -> None:
    det = Fed(CongestionDetector())
    out = []
    for i in range(300):
        congested = 100 <= i < 200
        out += det(row(T0 + i * MS, (200 * US if congested else 5 * US), seq=i))
        out += det(row(T0 + i * MS, 5 * US, src="c", seq=i))      # another link into b: healthy
    incidents = [o for o in out if isinstance(o, Incident)]
    assert [(o.state, o.target, o.node, o.severity) for o in incidents] == [
        ("open", "a->b", "b", "critical"), ("update", "a->b", "b", "critical"), ("resolve", "a->b", "b", "info")]
    assert len({o.incident_id for o in incidents}) == 1
    ev = orjson.loads(incidents[0].evidence)
    assert (ev["class"], ev["baseline_ns"], ev["budget_ns"]) == ("high", 5 * US, RULE.high_budget_ns)
    intents = [o for o in out if isinstance(o, CommandIntent)]
    # the sender's low class: redirected with the open (or limited where the sender has no alternate path), paused
    # when still over budget, resumed with the resolve
    assert [(i.node, i.action, i.target, i.params) for i in intents] == [
        ("a", "redirect", "low", {"share": "0.25", "dst": "10.0.0.2", "src": "10.0.0.1", "lease_s": "60",
                                  "toward": "b"}),
        ("a", "pause", "low", {"lease_s": "60", "toward": "b"}), ("a", "resume", "low", {"toward": "b"})]
    assert [inc.command_ids for inc in incidents] == [[command_id_of(i)] for i in intents]
    assert "paused on a" in incidents[1].detail and "resumed on a" in incidents[2].detail


def test_a_lasting_congestion_renews_its_leased_limit_every_20_s() -> None:
    """The actuator holds a limit only for its lease (60 s): while the congestion lasts, the current one (the pause,
    once escalated) is sent again every 20 s of the link's time, each with an update row naming it."""
    det = Fed(CongestionDetector())
    out = []
    for i in range(550):                                            # congested from 5 s on, one sample per 100 ms
        out += det(row(T0 + i * 100 * MS, 200 * US if i >= 50 else 5 * US, seq=i))
    intents = [o for o in out if isinstance(o, CommandIntent)]
    assert [i.action for i in intents] == ["redirect", "pause", "pause", "pause"]
    assert all(i.params["lease_s"] == "60" for i in intents)
    paused_at = intents[1].ts_ns
    assert [i.ts_ns - paused_at for i in intents[2:]] == [20 * S, 40 * S]
    renewals = [o for o in out if isinstance(o, Incident) and "renewed" in o.detail]
    assert [r.command_ids for r in renewals] == [[command_id_of(i)] for i in intents[2:]]
    assert len({o.incident_id for o in out if isinstance(o, Incident)}) == 1


def test_a_redirect_that_holds_the_congestion_off_is_renewed_itself() -> None:
    """Not escalated (the redirect keeps the queue just over budget, say): the redirect is what is renewed."""
    det = Fed(CongestionDetector(escalate=10**6))
    out = []
    for i in range(300):
        r = row(T0 + i * 100 * MS, 200 * US if i >= 50 else 5 * US, seq=i)
        if i > 60:   # later samples of the link are of other flows (another address of b): the redirect still names
            r = r.model_copy(update={"dst_ip": "10.0.1.2"})   # the flow that opened it
        out += det(r)
    intents = [o for o in out if isinstance(o, CommandIntent)]
    assert [i.action for i in intents] == ["redirect", "redirect"]
    assert intents[1].ts_ns - intents[0].ts_ns == 20 * S and intents[1].params == intents[0].params
    assert intents[0].params["dst"] == "10.0.0.2"


def test_low_class_congestion_orders_nothing() -> None:
    det = Fed(CongestionDetector())
    out = []
    for i in range(150):
        out += det(row(T0 + i * MS, 400 * US if i >= 50 else 5 * US, seq=i, priority=0))
    assert [(o.state, o.severity, o.command_ids) for o in out] == [("open", "warning", [])]


def test_a_replayed_sample_re_emits_its_commands() -> None:
    """A worker killed after writing its state but before publishing reads the sample again: the same outputs."""
    det = Fed(CongestionDetector())
    emitted = {}
    for i in range(80):
        out = det(row(T0 + i * MS, 200 * US if i >= 50 else 5 * US, seq=i))
        if out:
            emitted[i] = out
    opened_at = min(emitted)
    assert opened_at >= 50 and [type(o).__name__ for o in emitted[opened_at]] == ["Incident", "CommandIntent"]
    assert det(row(T0 + opened_at * MS, 200 * US, seq=opened_at)) == emitted[opened_at]


def test_a_lasting_rise_of_the_path_delay_becomes_the_floor_and_clears() -> None:
    """A route change (or a clock-correction step) adds 40 us for good: congestion at first, then the new floor."""
    link = LinkDelay()
    run(link, 1_000, lambda i: 5 * US)
    changes = run(link, 1_000, lambda i: 45 * US, t0=T0 + 10**9, step=100 * MS)   # 100 s at the new delay
    assert [(c.klass, c.opened) for c in changes] == [("high", True), ("high", False)]
    assert link.baseline() == 45 * US


def test_an_open_congestion_whose_collectives_stop_resumes_the_low_class() -> None:
    """The job ended while its link was congested: no high-priority sample for 10 s resolves it and resumes."""
    det = Fed(CongestionDetector())
    out = []
    for i in range(100):
        out += det(row(T0 + i * MS, 200 * US if i >= 50 else 5 * US, seq=i))
    assert [o.action for o in out if isinstance(o, CommandIntent)] == ["redirect", "pause"]
    later = det(row(T0 + 11 * 10**9, 5 * US, seq=1000, priority=0))      # only bulk traffic, 11 s later
    assert [(type(o).__name__, getattr(o, "state", getattr(o, "action", ""))) for o in later] == [
        ("Incident", "resolve"), ("CommandIntent", "resume")]


def test_a_link_that_goes_quiet_while_congested_is_resolved_when_its_state_expires() -> None:
    det = CongestionDetector()
    store = StateStore(det)
    out = []
    for i in range(100):
        out += det.process(store, row(T0 + i * MS, 200 * US if i >= 50 else 5 * US, seq=i))
        store.flush()
    assert any(isinstance(o, CommandIntent) for o in out)
    expired = det.tick(store, T0 + 20 * 10**9)
    assert [getattr(o, "state", getattr(o, "action", "")) for o in expired] == ["resolve", "resume"]
    assert expired[1].node == "a" and expired[0].node == "b"


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), spread=st.integers(1, 20), skew_ms=st.integers(-50, 50))
def test_out_of_order_and_clock_skewed_samples_give_one_incident_opened_and_resolved_in_time(
        seed: int, spread: int, skew_ms: int) -> None:
    """Samples of a link arrive shuffled within `spread` positions (segments of several flows, joined by several
    workers), and the two nodes' raw clocks disagree by `skew_ms` (the detector judges the corrected delay only):
    a 200-sample congestion still opens one high-class incident, within 20 samples of its start, and resolves it."""
    rng = random.Random(seed)
    delays = [healthy(rng) + (rng.randint(50 * US, 300 * US) if 300 <= i < 500 else 0) for i in range(800)]
    order = sorted(range(len(delays)), key=lambda i: i + rng.uniform(0, spread))
    det = Fed(CongestionDetector(escalate=10**6))
    out = []
    for i in order:
        r = row(T0 + i * MS, delays[i], seq=i)
        # the receiver's raw clock is off by skew_ms: its stamps and the raw latency move, the corrected one does not
        out += det(r.model_copy(update={"latency_ns": r.latency_ns + skew_ms * MS, "rx_ns": r.rx_ns + skew_ms * MS,
                                        "ts_ns": r.ts_ns + skew_ms * MS}))
    incidents = [o for o in out if isinstance(o, Incident) and o.state != "update"]
    assert [(o.state, orjson.loads(o.evidence)["class"]) for o in incidents] == [("open", "high"), ("resolve", "high")]
    # dated by the sample that tipped it, which may be a late healthy one from just before the start
    at = incidents[0].ts_ns - skew_ms * MS
    assert T0 + (300 - spread) * MS <= at <= T0 + (320 + spread) * MS, at - T0
    assert incidents[1].ts_ns - skew_ms * MS > T0 + 500 * MS
