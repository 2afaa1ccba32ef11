"""Silent nodes: heartbeats that stop while the peers' go on, told apart from a port that goes down."""

from __future__ import annotations

import time

from clocktower.producers.agent.heartbeat_source import HeartbeatSource
from clocktower.schemas.analytics import Incident
from clocktower.schemas.telemetry import LinkState, NodeHeartbeat
from clocktower.streams.detectors.silent_node import SilentNodeDetector
from clocktower.streams.processor_runner import ProcessorRunner
from clocktower.streams.processors import Processors
from tests.control_keys import TEST_SIGNER
from tests.test_detectors import T0, worker

MS = 10**6
NODES = ("a", "b", "c", "d")


def beats(t_ms: int, nodes: tuple[str, ...] = NODES, skew_ms: dict[str, int] | None = None) -> list[NodeHeartbeat]:
    """One heartbeat of each node at t_ms (its clock off by skew_ms), 200 ms apart."""
    skew_ms = skew_ms or {}
    return [NodeHeartbeat(node=n, ts_ns=T0 + (t_ms + skew_ms.get(n, 0)) * MS, seq=t_ms // 200, interval_ms=200)
            for n in nodes]


def run(w: ProcessorRunner, until_ms: int, nodes_at: dict[int, tuple[str, ...]] | None = None,
        skew_ms: dict[str, int] | None = None, start_ms: int = 0) -> list[Incident]:
    """Heartbeats every 200 ms from start_ms to until_ms; nodes_at[t] overrides who sends at t."""
    out = []
    for t in range(start_ms, until_ms + 1, 200):
        out += w.run(0, beats(t, (nodes_at or {}).get(t, NODES), skew_ms))
    return out


def test_a_node_that_stops_while_its_peers_go_on_is_silent_and_resolves_when_it_returns() -> None:
    w = worker(SilentNodeDetector())
    assert run(w, 2000) == []
    quiet = ("a", "b", "c")
    out = run(w, 4000, {t: quiet for t in range(2200, 4001, 200)}, start_ms=2200)
    [opened] = out
    assert (opened.kind, opened.state, opened.node, opened.target) == ("node_silent", "open", "d", "d")
    assert opened.ts_ns == T0 + 3200 * MS        # 1.2 s after its last heartbeat: more than 1 s
    assert "no heartbeat for 1.2 s" in opened.detail and "3 other nodes" in opened.detail
    [back] = w.run(0, beats(4200))
    assert (back.state, back.incident_id) == ("resolve", opened.incident_id) and "reports again" in back.detail
    assert run(w, 5000, start_ms=4400) == []


def test_when_everyone_stops_nobody_is_silent() -> None:
    """A broker outage or a stalled pipeline: no peer goes on, so no node is called silent."""
    w = worker(SilentNodeDetector())
    run(w, 2000)
    assert w.run(0, []) == []
    assert run(w, 9000, start_ms=9000) == []      # everyone again, 7 s later: nobody was silent alone


def test_a_node_whose_clock_is_a_little_off_is_not_silent() -> None:
    w = worker(SilentNodeDetector())
    assert run(w, 10_000, skew_ms={"d": -600, "c": 400}) == []


def test_late_heartbeats_resolve_as_late_not_missing() -> None:
    """A spool replayed after the others': its heartbeats date from before the incident."""
    det = SilentNodeDetector()
    w = worker(det)
    run(w, 1000)
    [opened] = run(w, 3000, {t: ("a", "b", "c") for t in range(1200, 3001, 200)}, start_ms=1200)
    replay = [NodeHeartbeat(node="d", ts_ns=T0 + t * MS, seq=t // 200, interval_ms=200) for t in range(1200, 3001, 200)]
    [late] = w.run(0, replay)
    assert (late.state, late.incident_id) == ("resolve", opened.incident_id) and "late" in late.detail
    assert det.counters()["late_heartbeats"] == 1


def test_a_silent_node_is_not_a_down_link() -> None:
    """A port that goes down while its node keeps sending is a link incident, not node_silent; a node that goes
    silent sends no link report, so no link incident opens for it."""
    processors = Processors(TEST_SIGNER, clock_ns=lambda: T0, known_after_ns=0)

    def link(node: str, t_ms: int, up: bool, changes: int) -> LinkState:
        return LinkState(node=node, ts_ns=T0 + t_ms * MS, interface="eth0", kind="ethernet", up=up,
                         carrier_changes=changes, speed_mbps=0, operstate="up" if up else "down", carrier=up,
                         backup="eth1")

    kinds = []
    for t in range(0, 4001, 200):
        events = beats(t) + [link(n, t, not (n == "b" and t >= 1000), 1 if n == "b" and t >= 1000 else 0)
                             for n in NODES]
        kinds += [(i.kind, i.node) for i in processors.on_batch(events) if isinstance(i, Incident)]
    assert ("link_down", "b") in kinds and not any(k == "node_silent" for k, _ in kinds)
    kinds = []
    for t in range(4200, 8001, 200):
        events = [e for e in beats(t) + [link(n, t, True, 1 if n == "b" else 0) for n in NODES] if e.node != "c"]
        kinds += [(i.kind, i.node) for i in processors.on_batch(events) if isinstance(i, Incident)]
    assert ("node_silent", "c") in kinds and not any(k.startswith("link") and n == "c" for k, n in kinds)


def test_a_replayed_batch_changes_nothing() -> None:
    table: dict[bytes, bytes] = {}
    w = worker(SilentNodeDetector(), table)
    run(w, 1000)
    before = dict(table)
    first = run(w, 2600, {t: ("a", "b", "c") for t in range(1200, 2601, 200)}, start_ms=1200)
    table.clear()
    table.update(before)              # the worker died before its commit: the batches come again
    again = run(worker(SilentNodeDetector(), table), 2600, {t: ("a", "b", "c") for t in range(1200, 2601, 200)},
                start_ms=1200)
    assert again == first and len(first) == 1


def test_a_replay_over_written_state_re_emits_what_it_made() -> None:
    """State written, outputs lost (a worker killed between the two): the batch read again sends the same rows."""
    table: dict[bytes, bytes] = {}
    w = worker(SilentNodeDetector(), table)
    run(w, 1000)
    opened: list = []
    t = 1000
    while not opened:                                            # until the batch that opens d's incident
        t += 200
        batch = beats(t, ("a", "b", "c"))
        opened = w.run(0, batch)
    assert worker(SilentNodeDetector(), table).run(0, batch) == opened      # read again after a crash
    back = beats(t + 200)
    [resolved] = w.run(0, back)
    assert resolved.state == "resolve" and resolved.incident_id == opened[0].incident_id
    assert worker(SilentNodeDetector(), table).run(0, back[3:]) == [resolved]   # d's heartbeat read again


def test_a_late_heartbeat_alone_resolves_and_the_tick_does_not_open_again() -> None:
    """A heartbeat of the silent node dated before its incident, arriving alone: the fleet time does not move, and
    the tick must not send the old open row again (it is not a replay of the batch that opened it). The node is
    still silent after that one late heartbeat: a new incident, from it, says so."""
    w = worker(SilentNodeDetector())
    run(w, 1000)
    [opened] = run(w, 2600, {t: ("a", "b", "c") for t in range(1200, 2601, 200)}, start_ms=1200)
    late, again = w.run(0, [NodeHeartbeat(node="d", ts_ns=T0 + 1200 * MS, seq=6, interval_ms=200)])
    assert (late.state, late.incident_id) == ("resolve", opened.incident_id)
    assert again.state == "open" and again.incident_id != opened.incident_id and "1.4 s" in again.detail


def test_a_copy_of_an_old_heartbeat_changes_nothing() -> None:
    w = worker(SilentNodeDetector())
    run(w, 1000)
    [opened] = run(w, 2600, {t: ("a", "b", "c") for t in range(1200, 2601, 200)}, start_ms=1200)
    assert w.run(0, [beats(800)[3]]) == []                       # a copy of d's heartbeat of 0.8 s
    assert opened.state == "open"


def test_a_node_silent_for_the_forget_time_is_resolved_as_no_longer_tracked() -> None:
    w = worker(SilentNodeDetector(forget_ns=3 * 10**9))
    run(w, 1000)
    out = run(w, 5000, {t: ("a", "b", "c") for t in range(1200, 5001, 200)}, start_ms=1200)
    assert [(o.state, o.node) for o in out] == [("open", "d"), ("resolve", "d")]
    assert "no longer tracked" in out[1].detail
    assert run(w, 5400, start_ms=5200) == []                    # back: starts afresh, nothing to resolve


def test_the_agent_sends_heartbeats_at_its_interval() -> None:
    sent: list[NodeHeartbeat] = []
    src = HeartbeatSource("n1", interval_s=0.02)
    assert src.check().ok
    src.start(sent.extend)
    time.sleep(0.25)
    src.stop()
    assert len(sent) >= 5 and [h.seq for h in sent] == list(range(len(sent)))
    assert all(h.node == "n1" and h.interval_ms == 20 for h in sent)
    assert all(b.ts_ns > a.ts_ns for a, b in zip(sent, sent[1:], strict=False))
