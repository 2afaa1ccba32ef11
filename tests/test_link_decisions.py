"""The pipeline's link decisions (issue 11 item 4): watchdog failover on a hard down, one incident per flap
burst, restore after T_stable, quarantine from the hourly count, no command without a backup, one physical
port one link, command ids on incidents, and a property test that nothing oscillates."""

from __future__ import annotations

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from clocktower.control.intent import CommandIntent, command_id_of
from clocktower.control.issuer import CommandIssuer
from clocktower.schemas.analytics import Incident
from clocktower.schemas.telemetry import LinkState
from clocktower.streams.detectors import fired_log
from clocktower.streams.detectors.link_flap import LinkFlapDetector
from clocktower.streams.processor import compound_key
from clocktower.streams.processor_context import context_from_settings
from clocktower.streams.processor_runner import ProcessorRunner
from clocktower.streams.remediation_budget import RemediationBudget
from clocktower.streams.settings import StreamsSettings
from clocktower.streams.state_store import StateStore
from tests.control_keys import TEST_SIGNER

T0 = 1_780_000_000 * 10**9
MS = 10**6
S = 10**9
MINUTE = 60 * S


def rep(ts: int, up: bool, changes: int, iface: str = "eth0", backup: str = "eth1", link: str = "",
        node: str = "node-1", kind: str = "ethernet", on_backup: bool | None = None,
        quarantined: bool | None = None) -> LinkState:
    ib = {"ib_state": "ACTIVE" if up else "DOWN", "port_xmit_data": 0, "port_rcv_data": 0, "port_xmit_packets": 0,
          "port_rcv_packets": 0, "port_rcv_errors": 0, "port_xmit_discards": 0, "symbol_error": 0,
          "link_downed": changes, "link_error_recovery": 0} if kind == "infiniband" else {}
    return LinkState(node=node, ts_ns=ts, interface=iface, kind=kind, up=up, carrier_changes=changes,
                     speed_mbps=0, operstate="up" if up else "down", carrier=up, link=link, backup=backup,
                     on_backup=on_backup, quarantined=quarantined, **ib)


class Node:
    """One node's reports through the detector, one per batch, then `tick` at the partition's time (one node:
    its newest report), with every entry through the codec: what a worker does."""

    def __init__(self, **options: int) -> None:
        self.det = LinkFlapDetector(**options)
        self.store = StateStore(self.det)
        self.now = 0

    def __call__(self, e: LinkState) -> list:
        out = self.det.process(self.store, e)
        return out + self.tick(e.ts_ns)

    def tick(self, now: int) -> list:
        self.now = max(self.now, now)
        self.store.now_ns = self.now
        out = self.det.tick(self.store, self.now)
        self.store.flush()
        return out


def commands(out: list) -> list[tuple[str, dict[str, str]]]:
    return [(c.action, c.params) for c in out if isinstance(c, CommandIntent)]


def incidents(out: list) -> list[Incident]:
    return [e for e in out if isinstance(e, Incident)]


def test_a_hard_down_fails_over_after_the_watchdog_without_a_flap() -> None:
    """Before: one carrier change never reached the 3-in-10-s flap rule, so a dead link never failed over."""
    node = Node()
    assert node(rep(T0, True, 1)) == []
    assert node(rep(T0 + S, False, 2)) == []                   # down: the watchdog starts
    assert node(rep(T0 + S + 30 * MS, True, 1, iface="eth1", backup="")) == []   # 30 ms later: not yet
    out = node(rep(T0 + S + 60 * MS, True, 1, iface="eth1", backup=""))   # eth0 silent; the node's time passes
    (inc,) = incidents(out)
    (cmd,) = [c for c in out if isinstance(c, CommandIntent)]
    assert (inc.kind, inc.state, inc.severity, inc.target) == ("link_down", "open", "critical", "node-1/eth0")
    assert (cmd.action, cmd.target, cmd.params) == ("failover", "eth0", {"from": "eth0", "to": "eth1"})
    assert cmd.ts_ns == inc.ts_ns == T0 + S + 50 * MS and cmd.incident_id == inc.incident_id
    assert inc.command_ids == [command_id_of(cmd)]
    for i in range(2, 30):                                     # still down: nothing more
        assert node(rep(T0 + i * S, False, 2)) == []


def test_the_links_next_report_fires_the_watchdog_with_the_same_ids_as_the_timer() -> None:
    by_timer, by_report = Node(), Node()
    for n in (by_timer, by_report):
        n(rep(T0, True, 1))
        n(rep(T0 + S, False, 2))
    timer = by_timer(rep(T0 + 2 * S, True, 1, iface="eth1", backup=""))
    report = by_report(rep(T0 + 2 * S, False, 2))
    assert timer == report and commands(report) == [("failover", {"from": "eth0", "to": "eth1"})]


def test_a_blip_shorter_than_the_watchdog_is_recorded_but_orders_nothing_and_zero_fails_over_at_once() -> None:
    node = Node()
    node(rep(T0, True, 1))
    assert node(rep(T0 + S, False, 2)) == []
    assert node(rep(T0 + S + 30 * MS, True, 3)) == []               # back up: recorded once it stays up 1 s
    out = node(rep(T0 + 2 * S + 30 * MS, True, 3))
    assert commands(out) == []
    opened, resolved = incidents(out)
    assert (opened.kind, opened.state, opened.severity, opened.target) == ("link_blip", "open", "info", "node-1/eth0")
    assert resolved.state == "resolve" and resolved.incident_id == opened.incident_id
    assert "30 ms" in opened.detail and orjson.loads(opened.evidence)["down_ms"] == 30.0
    assert opened.ts_ns == T0 + 2 * S + 30 * MS
    assert node(rep(T0 + 5 * S, True, 3)) == [] and node.store.get('["node-1","eth0","watchdog"]') is None
    at_once = Node(watchdog_ns=0)
    at_once(rep(T0, True, 1))
    assert commands(at_once(rep(T0 + S, False, 2))) == [("failover", {"from": "eth0", "to": "eth1"})]


def test_repeated_blips_warn_of_a_failing_optic_and_one_between_two_reports_is_seen_in_the_counter() -> None:
    node = Node()
    node(rep(T0, True, 1))
    rows = []
    for i in range(3):
        t = T0 + (i + 1) * MINUTE
        node(rep(t, False, 2 + 2 * i))
        node(rep(t + 20 * MS, True, 3 + 2 * i))
        rows += incidents(node(rep(t + 2 * S, True, 3 + 2 * i)))
    opens = [r for r in rows if r.state == "open"]
    assert [r.severity for r in opens] == ["info", "info", "warning"] and len({r.incident_id for r in opens}) == 3
    assert "failing optic" in opens[-1].detail and orjson.loads(opens[-1].evidence)["downs_last_hour"] == 3
    node(rep(T0 + 5 * MINUTE, True, 9))                             # down and up between two periodic reports
    (unseen, _) = incidents(node(rep(T0 + 5 * MINUTE + 2 * S, True, 9)))
    assert unseen.kind == "link_blip" and "unknown time" in unseen.detail
    assert orjson.loads(unseen.evidence)["down_ms"] is None


def test_a_blip_while_a_flap_incident_is_open_is_recorded_but_the_tail_of_a_fast_burst_is_not() -> None:
    """Found by benchmarks/detection.py: a 30 ms blip 2.7 s after a flap burst on the same port, its incident still
    open (waiting to restore), left no trace."""
    node = Node()
    node(rep(T0, True, 1))
    for i in range(3):                                             # a burst of 20 ms downs: one link_flap incident
        node(rep(T0 + S + i * 100 * MS, False, 2 + 2 * i))
        node(rep(T0 + S + i * 100 * MS + 20 * MS, True, 3 + 2 * i))
    after_burst = incidents(node(rep(T0 + 3 * S, True, 7)))
    assert [i.kind for i in after_burst] == []                     # its last down was not a blip of its own
    flap = node.store.get('["node-1","eth0"]')
    assert flap.incident_kind == "link_flap" and flap.incident_id is not None
    node(rep(T0 + 5 * S, False, 8))                                # 2 s later, isolated: a blip, incident still open
    node(rep(T0 + 5 * S + 30 * MS, True, 9))
    out = node(rep(T0 + 6 * S + 30 * MS, True, 9))
    assert commands(out) == []
    opened, resolved = incidents(out)
    assert (opened.kind, opened.state, resolved.state) == ("link_blip", "open", "resolve")
    assert flap.incident_id in opened.detail and orjson.loads(opened.evidence)["open_incident"] == flap.incident_id
    restore = node(rep(T0 + 16 * S, True, 9))                      # the flap incident restores 10 s after the blip
    assert [(i.kind, i.state) for i in incidents(restore)] == [("link_flap", "resolve")]
    assert commands(restore) == [("restore", {"from": "eth1", "to": "eth0"})]


def test_a_port_first_seen_down_was_never_seen_working_and_is_not_failed_over() -> None:
    node = Node()
    assert node(rep(T0, False, 0)) == [] and node(rep(T0 + 10 * S, False, 0)) == []
    node(rep(T0 + 11 * S, True, 1))
    node(rep(T0 + 12 * S, False, 2))
    assert commands(node(rep(T0 + 13 * S, False, 2))) == [("failover", {"from": "eth0", "to": "eth1"})]


def test_a_flap_burst_is_one_incident_with_one_failover() -> None:
    """Downs of 10 ms (under the watchdog), 12 transitions (6 downs, under the hourly limit): one link_flap
    incident, one failover, one restore."""
    node = Node()
    out = node(rep(T0, True, 1))
    for i in range(1, 13):
        out += node(rep(T0 + i * 10 * MS, i % 2 == 0, 1 + i))
    rows = incidents(out)
    assert [(r.kind, r.state) for r in rows] == [("link_flap", "open")] and rows[0].detail.startswith("3 carrier")
    assert commands(out) == [("failover", {"from": "eth0", "to": "eth1"})]
    last = T0 + 120 * MS
    assert node(rep(last + 10 * S - 1, True, 13)) == []       # up, unchanged, 1 ns short of T_stable
    done = node(rep(last + 10 * S, True, 13))
    assert [(r.state, r.incident_id) for r in incidents(done)] == [("resolve", rows[0].incident_id)]
    assert commands(done) == [("restore", {"from": "eth1", "to": "eth0"})]
    assert incidents(done)[0].command_ids == [command_id_of(c) for c in out + done if isinstance(c, CommandIntent)]


def test_a_flap_after_a_hard_down_updates_the_open_incident() -> None:
    node = Node()
    node(rep(T0, True, 1))
    node(rep(T0 + S, False, 2))
    opened = node(rep(T0 + 2 * S, True, 3))                    # down 1 s: link_down + failover
    flapped = node(rep(T0 + 3 * S, False, 4))                  # third change: the same incident, updated
    assert [(r.kind, r.state) for r in incidents(opened)] == [("link_down", "open")]
    (upd,) = incidents(flapped)
    assert (upd.kind, upd.state, upd.incident_id) == ("link_flap", "update", incidents(opened)[0].incident_id)
    assert upd.command_ids == incidents(opened)[0].command_ids and commands(flapped) == []
    assert node(rep(T0 + 4 * S, True, 5)) == []                # its 1 s down: already failed over


def test_an_rdma_port_of_a_netdev_is_that_netdev_not_a_second_link() -> None:
    """Before: eth0 and mlx5_0/1 each opened an incident for one flap, the second with {'to': ''}."""
    node = Node()
    out = []
    for i in range(0, 8):
        up = i % 2 == 0
        out += node(rep(T0 + i * 10 * MS, up, 1 + i))
        out += node(rep(T0 + i * 10 * MS + 1, up, i // 2, iface="mlx5_0/1", link="eth0", backup="", kind="infiniband"))
    assert [(r.kind, r.target) for r in incidents(out)] == [("link_flap", "node-1/eth0")]
    assert commands(out) == [("failover", {"from": "eth0", "to": "eth1"})]
    assert node.det.counters()["aliases"] == 8
    assert all(orjson.loads(k)[1] == "eth0" for k in node.store.backing)


def test_a_link_without_a_backup_gets_an_incident_that_says_so_and_no_command() -> None:
    node = Node()
    node(rep(T0, True, 1, backup=""))
    node(rep(T0 + S, False, 2, backup=""))
    out = node(rep(T0 + 2 * S, True, 3, backup=""))
    out += node(rep(T0 + 2 * S + 10 * MS, False, 4, backup="")) + node(rep(T0 + 20 * S, True, 5, backup=""))
    out += node(rep(T0 + 30 * S, True, 5, backup=""))
    assert commands(out) == []
    assert "no backup port configured for eth0: no failover" in incidents(out)[0].detail
    assert [r.state for r in incidents(out)] == ["open", "update", "resolve"]
    assert all(r.command_ids == [] for r in incidents(out))


def test_an_infiniband_port_counts_link_downed_as_downs() -> None:
    node = Node(quarantine_flaps=2)
    node(rep(T0, True, 0, iface="ib0", backup="ib1", kind="infiniband"))
    out = node(rep(T0 + S, True, 3, iface="ib0", backup="ib1", kind="infiniband"))   # 3 downs between reports
    assert [(c[0]) for c in commands(out)] == ["failover", "quarantine"]


def _flap_once(node: Node, t: int, count: int) -> list:
    """A 1 s down at t (over the watchdog) and 12 s of stable carrier after it."""
    out = node(rep(t, False, count + 1))
    out += node(rep(t + S, True, count + 2))
    return out + node(rep(t + 12 * S, True, count + 2))


def test_more_than_n_flaps_an_hour_quarantine_the_link_and_no_restore_follows() -> None:
    node = Node(quarantine_flaps=3)
    node(rep(T0, True, 1))
    out = []
    for k in range(3):                                        # 3 downs: each failed over and restored
        out += _flap_once(node, T0 + (k + 1) * MINUTE, 1 + 2 * k)
    assert [a for a, _ in commands(out)] == ["failover", "restore"] * 3
    fourth = _flap_once(node, T0 + 4 * MINUTE, 7)
    q = [r for r in incidents(fourth) if r.kind == "link_quarantine"]
    assert len(q) == 1 and (q[0].severity, q[0].state) == ("critical", "open")
    assert "clocktower control release node-1 eth0" in q[0].detail and "4 flaps" in q[0].detail
    assert [a for a, _ in commands(fourth)] == ["quarantine", "failover"]   # the down's own failover: idempotent
    qcmd = next(c for c in fourth if isinstance(c, CommandIntent))
    assert qcmd.params == {"from": "eth0", "to": "eth1"} and q[0].command_ids == [command_id_of(qcmd)]
    assert "quarantined" in incidents(fourth)[-1].detail and incidents(fourth)[-1].state == "resolve"
    later = _flap_once(node, T0 + 5 * MINUTE, 9)               # still quarantined: a failover (idempotent), no restore
    assert commands(later) == [("failover", {"from": "eth0", "to": "eth1"})]
    assert "no restore until released" in incidents(later)[0].detail and "quarantined" in incidents(later)[-1].detail
    # An hour on, the count is back under the limit: the mark clears and the link is failed over and restored again
    again = _flap_once(node, T0 + 70 * MINUTE, 11)
    assert [a for a, _ in commands(again)] == ["failover", "restore"]


def _quarantined(node: Node) -> None:
    """4 downs an hour with quarantine_flaps=3: the 4th quarantines eth0 (traffic held on eth1)."""
    node(rep(T0, True, 1))
    for k in range(4):
        _flap_once(node, T0 + (k + 1) * MINUTE, 1 + 2 * k)


def test_a_hard_down_while_quarantined_still_fails_over_and_is_not_restored() -> None:
    """Before: while the mark held (up to an hour), a released link that went down hard got no failover and the
    incident said traffic stayed on eth1 while it was on the dead primary. A failover is idempotent on the
    node (already on eth1 if still quarantined), so the detector orders it; only the restore stays held."""
    node = Node(quarantine_flaps=3)
    _quarantined(node)
    t = T0 + 6 * MINUTE
    out = node(rep(t, False, 10))
    for i in range(1, 21):                                    # a 20 s hard down
        out += node(rep(t + i * S, False, 10))
    assert commands(out) == [("failover", {"from": "eth0", "to": "eth1"})]
    (row,) = incidents(out)
    assert (row.kind, row.state) == ("link_down", "open") and "no restore until released" in row.detail
    back = node(rep(t + 21 * S, True, 11)) + node(rep(t + 40 * S, True, 11))
    assert commands(back) == [] and [r.state for r in incidents(back)] == ["resolve"]
    assert "quarantined" in incidents(back)[0].detail


def test_a_blip_the_nodes_watchdog_failed_over_is_restored_after_t_stable() -> None:
    """Before: with the agent's T_watchdog (50 ms) shorter than the pipeline's (here 200 ms), a 100 ms down was
    failed over by the agent and never seen long enough here: no incident, no restore, traffic left on eth1."""
    node = Node(watchdog_ns=200 * MS)
    t = T0 + S
    assert node(rep(T0, True, 1, on_backup=False)) == []
    assert node(rep(t, False, 2, on_backup=False)) == []                # the agent's watchdog moves it 50 ms on
    out = node(rep(t + 100 * MS, True, 3, on_backup=True))             # back up, reported on eth1
    (row,) = incidents(out)
    assert (row.kind, row.state) == ("link_down", "open") and commands(out) == []   # no second failover
    assert "the node's watchdog moved eth0's traffic to eth1" in row.detail
    assert node(rep(t + 5 * S, True, 3, on_backup=True)) == []
    done = node.tick(t + 100 * MS + 10 * S)                             # T_stable after the up, by time alone
    assert commands(done) == [("restore", {"from": "eth1", "to": "eth0"})]
    (end,) = incidents(done)
    assert end.incident_id == row.incident_id and end.state == "resolve"
    # Reports made before the node applied the restore still say eth1: no second incident within the grace ...
    assert node(rep(t + 12 * S, True, 3, on_backup=True)) == []
    assert node(rep(t + 13 * S, True, 3, on_backup=False)) == []
    # ... but a node still on eth1 T_stable after it (the restore was lost or failed) is restored again, at once
    # (the link has been stable all along), and then after twice as long, ...
    restored = end.ts_ns
    assert node(rep(restored + 9 * S, True, 3, on_backup=True)) == []
    again = node(rep(restored + 10 * S, True, 3, on_backup=True))
    assert [r.state for r in incidents(again)] == ["open", "resolve"]
    assert "ordering it again" in incidents(again)[0].detail
    assert commands(again) == [("restore", {"from": "eth1", "to": "eth0"})]
    assert incidents(again)[1].ts_ns == restored + 10 * S              # never before its incident opened
    restored = incidents(again)[1].ts_ns
    assert node(rep(restored + 19 * S, True, 3, on_backup=True)) == []
    third = node(rep(restored + 20 * S, True, 3, on_backup=True))
    assert commands(third) == [("restore", {"from": "eth1", "to": "eth0"})]
    # ... until the node reports it back: the wait starts short again.
    assert node(rep(restored + 21 * S, True, 3, on_backup=False)) == []
    assert node.store.get(compound_key("node-1", "eth0")).restore_retries == 0


def test_reports_without_an_actuators_view_change_nothing() -> None:
    node = Node(watchdog_ns=200 * MS)
    node(rep(T0, True, 1))
    node(rep(T0 + S, False, 2))
    assert node(rep(T0 + S + 100 * MS, True, 3)) == []
    assert {(i.kind, i.state) for i in incidents(node.tick(T0 + 30 * S))} == {("link_blip", "open"),
                                                                              ("link_blip", "resolve")}
    assert commands(node.tick(T0 + 40 * S)) == []   # a blip is recorded; without the node's view nothing is ordered


def test_a_release_seen_in_the_nodes_reports_ends_the_quarantine() -> None:
    """Before: the detector never learned of `clocktower control release`: its mark held restores for up to an
    hour after it, and the link_quarantine incident stayed open for ever."""
    node = Node(quarantine_flaps=3)
    node(rep(T0, True, 1))
    out = []
    for k in range(4):
        out += _flap_once(node, T0 + (k + 1) * MINUTE, 1 + 2 * k)
    (q,) = [r for r in incidents(out) if r.kind == "link_quarantine"]
    t = T0 + 5 * MINUTE
    assert node(rep(t, True, 9, on_backup=True, quarantined=True)) == []
    released = node(rep(t + S, True, 9, on_backup=False, quarantined=False))   # the actuator restored it
    assert [(r.incident_id, r.state) for r in incidents(released)] == [(q.incident_id, "resolve")]
    # A new down within the hour fails over and is restored after T_stable, not held as while quarantined,
    # and one down is far from the limit again (the count restarted).
    back = _flap_once(node, t + MINUTE, 9)
    assert [a for a, _ in commands(back)] == ["failover", "restore"]
    assert not [r for r in incidents(back) if r.kind == "link_quarantine"]


def _down_that_quarantines(node: Node) -> tuple[int, Incident]:
    """3 flaps, then at t the 4th down quarantines eth0 (quarantine_flaps=3): (t, its link_quarantine incident)."""
    node(rep(T0, True, 1))
    for k in range(3):
        _flap_once(node, T0 + (k + 1) * MINUTE, 1 + 2 * k)
    t = T0 + 4 * MINUTE
    (q,) = [r for r in incidents(node(rep(t, False, 8))) if r.kind == "link_quarantine"]
    return t, q


def test_the_release_resolves_the_quarantine_incident_once_and_only_after_the_grace() -> None:
    node = Node(quarantine_flaps=3)
    t, q = _down_that_quarantines(node)
    # A report made before the node applied the quarantine says "not quarantined": that is no release.
    early = node(rep(t + S, True, 9, on_backup=True, quarantined=False))
    assert not [r for r in incidents(early) if r.kind == "link_quarantine"]
    held = node(rep(t + 2 * MINUTE, True, 9, on_backup=True, quarantined=True))
    assert commands(held) == [] and [(r.kind, r.state) for r in incidents(held)] == [("link_down", "resolve")]
    out = node(rep(t + 3 * MINUTE, True, 9, on_backup=False, quarantined=False))
    (end,) = incidents(out)
    assert (end.incident_id, end.kind, end.state, end.opened_ns) == (q.incident_id, "link_quarantine", "resolve",
                                                                      q.ts_ns)
    assert node(rep(t + 4 * MINUTE, True, 9, on_backup=False, quarantined=False)) == []


def test_a_link_the_node_holds_quarantined_stays_held_here_after_the_hour() -> None:
    """The hourly count alone no longer clears the mark while the node says the link is still held: a restore
    ordered then would only be refused."""
    node = Node(quarantine_flaps=3)
    node(rep(T0, True, 1))
    for k in range(4):
        _flap_once(node, T0 + (k + 1) * MINUTE, 1 + 2 * k)
    t = T0 + 70 * MINUTE
    later = []
    for i, (up, count) in enumerate([(True, 9), (False, 10), (True, 11), (True, 11)]):
        later += node(rep(t + i * 12 * S, up, count, on_backup=True, quarantined=True))
    assert [a for a, _ in commands(later)] == ["failover"]
    # Reports without the node's view (an agent restarted without --actuate) let the hourly rule clear it again.
    for i, (up, count) in enumerate([(False, 12), (True, 13), (True, 13)]):
        later += node(rep(t + (4 + i) * 12 * S, up, count))
    assert [a for a, _ in commands(later)] == ["failover", "failover", "restore"]


def _failed_over(node: Node, t: int) -> None:
    node(rep(t, True, 1))
    node(rep(t + S, False, 2))
    node(rep(t + 2 * S, False, 2))                            # watchdog: failover
    node(rep(t + 3 * S, True, 3))                             # up: restore due at t + 13 s


def test_a_link_reporting_only_on_change_is_restored_by_the_partitions_time() -> None:
    """Before: a restore was decided only on the link's own report; with reports only on change
    (CLOCKTOWER_AGENT_LINK_REPORT_S=0) a failed-over link was never restored."""
    node = Node()
    _failed_over(node, T0)
    assert node.tick(T0 + 13 * S - 1) == []                   # other links move the time: 1 ns short of T_stable
    out = node.tick(T0 + 13 * S)
    assert commands(out) == [("restore", {"from": "eth1", "to": "eth0"})]
    assert [r.state for r in incidents(out)] == ["resolve"] and incidents(out)[0].command_ids[-1] == \
        command_id_of(next(c for c in out if isinstance(c, CommandIntent)))
    assert node.tick(T0 + 60 * S) == [] and node(rep(T0 + 61 * S, True, 3)) == []   # once


def test_the_restore_timer_and_the_links_next_report_give_the_same_ids() -> None:
    by_timer, by_report, late = Node(), Node(), Node()
    for n in (by_timer, by_report, late):
        _failed_over(n, T0)
    timer = by_timer(rep(T0 + 30 * S, True, 1, iface="eth2", backup=""))   # another link: the partition's time
    report = by_report(rep(T0 + 13 * S, True, 3))
    slow = late(rep(T0 + 30 * S, True, 3))                    # a long report interval: restored as of T_stable
    assert timer == report == slow and commands(report) == [("restore", {"from": "eth1", "to": "eth0"})]
    assert next(c for c in report if isinstance(c, CommandIntent)).ts_ns == T0 + 13 * S


def test_a_restore_fired_by_time_is_sent_again_when_the_worker_dies_before_publishing_it() -> None:
    """Before: what a timer fired was in no delivery log; a worker killed after writing its state (timer gone)
    but before publishing lost the restore. It is now logged under the batch's report, which is replayed."""
    backing: dict[bytes, bytes] = {}
    first = Node()
    first.store = StateStore(first.det, backing)
    _failed_over(first, T0)
    trigger = rep(T0 + 30 * S, True, 1, iface="eth2", backup="")    # another link moves the partition's time
    fired = first(trigger)
    assert commands(fired) == [("restore", {"from": "eth1", "to": "eth0"})]
    restarted = Node()                                              # the table recovered, the offset not committed
    restarted.store = StateStore(restarted.det, backing)
    assert restarted(trigger) == fired                              # the same rows and command ids, again
    assert restarted.det.redelivered == 1
    assert restarted(rep(T0 + 31 * S, True, 1, iface="eth2", backup="")) == []   # and nothing more after it


def test_a_carrier_change_cancels_the_restore_timer() -> None:
    node = Node()
    _failed_over(node, T0)
    node(rep(T0 + 5 * S, True, 5))                            # down and up again between reports: restart T_stable
    early = node.tick(T0 + 14 * S)                            # (that blip is recorded: the link was stable 2 s before)
    assert commands(early) == [] and [(i.kind, i.state) for i in incidents(early)] == [("link_blip", "open"),
                                                                                      ("link_blip", "resolve")]
    assert commands(node.tick(T0 + 15 * S)) == [("restore", {"from": "eth1", "to": "eth0"})]
    down = Node()
    _failed_over(down, T0)
    down(rep(T0 + 5 * S, False, 4))                           # down again: no restore, however long
    assert commands(down.tick(T0 + 60 * S)) == []


def test_a_limit_above_64_counts_every_down() -> None:
    node = Node(quarantine_flaps=100)
    out = node(rep(T0, True, 1))
    for i in range(1, 201):                                    # 100 downs of 10 ms: at the limit, not over it
        out += node(rep(T0 + i * 10 * MS, i % 2 == 0, 1 + i))
    assert [a for a, _ in commands(out)] == ["failover"]
    over = node(rep(T0 + 201 * 10 * MS, False, 202))           # the 101st
    assert [a for a, _ in commands(over)] == ["quarantine"] and "101 flaps" in incidents(over)[0].detail


def test_settings_reach_the_detector() -> None:
    s = StreamsSettings(streams_link_watchdog_ms=0, streams_link_stable_s=2.5, streams_link_quarantine_flaps=4,
                        streams_spare_nodes="spare-a, spare-b,spare-a")
    budget = RemediationBudget()
    ctx = context_from_settings(s, remediation_budget=budget)
    assert ctx.remediation_budget is budget and ctx.segment_ttl_ns == 10 * S
    det = LinkFlapDetector.from_context(ctx)
    assert (det.watchdog_ns, det.stable_ns, det.quarantine_flaps) == (0, 2_500_000_000, 4)
    assert ctx.spare_nodes == ("spare-a", "spare-b")
    assert StreamsSettings(streams_spare_nodes='["x", "y"]').streams_spare_nodes == ["x", "y"]
    assert StreamsSettings().streams_spare_nodes == []


def test_signed_through_the_runner_incidents_name_the_commands_that_were_issued() -> None:
    runner = ProcessorRunner(LinkFlapDetector(), issuer=CommandIssuer(TEST_SIGNER))
    out = runner.run(0, [rep(T0, True, 1), rep(T0 + S, False, 2)]) + runner.run(0, [rep(T0 + 2 * S, False, 2)])
    (inc,) = incidents(out)
    assert inc.command_ids == [c.command_id for c in out if not isinstance(c, Incident)] and inc.command_ids


# --- nothing oscillates ----------------------------------------------------------------------------------------

STABLE, WATCHDOG, QUARANTINE = 10 * S, 50 * MS, 3

GAPS = [1 * MS, 30 * MS, 200 * MS, S, 3 * S, 6 * S, 11 * S, 10 * MINUTE, 40 * MINUTE]
reports = st.lists(st.tuples(st.sampled_from(GAPS), st.booleans(), st.integers(0, 2), st.booleans()),
                   min_size=1, max_size=60)


class Oracle:
    """What the commands for one link may be, from its reports and the incident rows alone."""

    def __init__(self, t: int) -> None:
        self.state = "primary"            # where traffic is after the commands so far ("held": quarantined there)
        self.quarantined = False          # the detector's mark: from a quarantine until a report finds the hourly
        self.open: set[str] = set()       # count under the limit and no incident open
        self.up, self.last_change = True, t
        self.downs: list[int] = []        # times of down transitions

    def outputs(self, out: list) -> None:
        """The outputs of a tick, or of a report before `report` applies it (a restore is as of T_stable)."""
        for e in out:
            if isinstance(e, Incident) and e.kind != "link_quarantine":
                (self.open.add if e.state == "open" else self.open.discard if e.state == "resolve" else len)(
                    e.incident_id)
            elif isinstance(e, CommandIntent):
                self.command(e)

    def report(self, t: int, up: bool, changed: int) -> None:
        if changed:
            self.last_change = t
        self.downs += [t] * ((changed + self.up) // 2)
        self.up = up
        if self.quarantined and not self.open and sum(1 for d in self.downs if d > t - 3600 * S) < QUARANTINE:
            self.quarantined, self.state = False, "held"

    def command(self, c: CommandIntent) -> None:
        assert c.params.get("from") and c.params.get("to"), "a command with an empty port"
        if c.action == "failover":
            if self.quarantined:          # idempotent on the node: traffic is held on the backup already
                return
            assert self.state in ("primary", "held"), "two failovers without a restore between them"
            self.state = "backup"
        elif c.action == "restore":
            assert not self.quarantined, "a restore while quarantined"
            assert self.state == "backup", "a restore without a failover"
            assert self.up and c.ts_ns == self.last_change + STABLE, "a restore not at T_stable of stable carrier"
            self.state = "primary"
        elif c.action == "quarantine":
            assert not self.quarantined, "quarantined twice"
            self.quarantined, self.state = True, "held"


@settings(max_examples=400, deadline=None)
@given(reports, st.sampled_from([0, WATCHDOG]), st.booleans())
def test_commands_for_a_link_never_oscillate(steps: list[tuple[int, bool, int, bool]], watchdog: int,
                                             backup: bool) -> None:
    """Random carrier sequences (gaps, state, extra changes between reports, the node's other links moving the
    partition's time): no restore while quarantined (until the hourly count is back under the limit), failover
    and restore strictly alternate outside quarantine; at most one failover and one restore per incident; a
    restore exactly T_stable after the newest change of a link up since; never a command with an empty port;
    every command is named by its incident."""
    node = Node(watchdog_ns=watchdog, stable_ns=STABLE, quarantine_flaps=QUARANTINE)
    port = "eth1" if backup else ""
    t, up, count = T0, True, 1
    oracle = Oracle(t)
    out = node(rep(t, up, count, backup=port))
    for gap, new_up, extra, tick in steps:
        if tick:                                               # another link of the node moves the time first
            ticked = node.tick(t + gap - 1)
            oracle.outputs(ticked)
            out += ticked
        t += gap
        changed = (new_up != up) + 2 * extra
        count += changed
        emitted = node(rep(t, new_up, count, backup=port))
        oracle.outputs(emitted)
        oracle.report(t, new_up, changed)
        up = new_up
        out += emitted
    cmds = [c for c in out if isinstance(c, CommandIntent)]
    assert backup or cmds == []
    per_incident: dict[str, list[str]] = {}
    for c in cmds:
        if c.action in ("failover", "restore"):
            per_incident.setdefault(c.incident_id, []).append(c.action)
    assert all(a in (["failover"], ["failover", "restore"]) for a in per_incident.values()), per_incident
    assert {i for r in incidents(out) for i in r.command_ids} == {command_id_of(c) for c in cmds}


def test_a_quarantine_the_node_never_held_is_not_taken_for_a_release() -> None:
    """Before: any report saying "not quarantined" 5 s after the quarantine counted as a release, so a lagging worker
    replaying the node's older reports, or a quarantine the node never applied, resolved the incident as released."""
    node = Node(quarantine_flaps=3)
    t, q = _down_that_quarantines(node)
    lagging = []
    for i in range(1, 30):                                     # 29 s of reports made before the node applied it
        lagging += node(rep(t + i * S, True, 9, on_backup=False, quarantined=False))
    assert not [r for r in incidents(lagging) if r.kind == "link_quarantine"]
    assert [a for a, _ in commands(lagging)] == ["failover"]  # the down's own; still marked: no restore
    held = node(rep(t + 31 * S, True, 9, on_backup=True, quarantined=True))
    assert not [r for r in incidents(held) if r.kind == "link_quarantine"]
    released = node(rep(t + 40 * S, True, 9, on_backup=False, quarantined=False))
    assert [(r.incident_id, r.state) for r in incidents(released) if r.kind == "link_quarantine"] == [
        (q.incident_id, "resolve")]


def test_a_late_report_orders_its_restore_once_not_twice() -> None:
    """Before: the restore's order time was taken as its deadline, so the report that ordered it 15 s late (an agent
    away) also looked like a node still on its backup 15 s after the restore: a second restore at once."""
    node = Node()
    node(rep(T0, True, 1, on_backup=False))
    node(rep(T0 + S, False, 2, on_backup=False))
    node(rep(T0 + 2 * S, True, 3, on_backup=True))            # the node's watchdog moved it; restore due at +12 s
    late = node(rep(T0 + 27 * S, True, 3, on_backup=True))     # the next report comes 25 s later
    assert commands(late) == [("restore", {"from": "eth1", "to": "eth0"})]
    assert not any("ordering it again" in r.detail for r in incidents(late))
    assert node(rep(T0 + 30 * S, True, 3, on_backup=True)) == []   # within T_stable of the order: no retry yet


def test_a_restore_the_node_never_applies_is_ordered_again_at_most_every_64_t_stable() -> None:
    """The wait between orders doubles from T_stable (10 s) and stops doubling at 2**MAX_RETRY_DOUBLINGS times it."""
    node = Node(watchdog_ns=200 * MS)
    t = T0 + S
    node(rep(T0, True, 1, on_backup=False))
    node(rep(t, False, 2, on_backup=False))
    node(rep(t + 100 * MS, True, 3, on_backup=True))
    (first,) = incidents(node.tick(t + 100 * MS + 10 * S))
    ordered = [first.ts_ns]
    for second in range(1, 2200):                      # the node reports every second, still on eth1
        out = node(rep(first.ts_ns + second * S, True, 3, on_backup=True))
        if commands(out):
            assert commands(out) == [("restore", {"from": "eth1", "to": "eth0"})]
            ordered.append(incidents(out)[-1].ts_ns)
    gaps = [(b - a) // S for a, b in zip(ordered, ordered[1:], strict=False)]
    assert gaps == [10, 20, 40, 80, 160, 320, 640, 640]


def test_a_fleet_wide_restore_is_replayable_and_kept_in_small_records_not_in_one_links_entry() -> None:
    """Before: every output a tick fired was appended to the entry of the batch's report, which every later
    report of that link rewrites: 200 links restored at once put ~200 KB in one link's entry."""
    links = 200
    backing: dict[bytes, bytes] = {}
    first = Node()
    first.store = StateStore(first.det, backing)
    for i in range(links):
        iface, backup = f"p{i}", f"b{i}"
        first(rep(T0, True, 1, iface=iface, backup=backup))
        first(rep(T0 + S, False, 2, iface=iface, backup=backup))
        first(rep(T0 + 2 * S, False, 2, iface=iface, backup=backup))         # watchdog: failover
        first(rep(T0 + 3 * S, True, 3, iface=iface, backup=backup))          # up: restore due at T0 + 13 s
    trigger = rep(T0 + 30 * S, True, 1, iface="eth9", backup="")
    fired = first(trigger)
    assert len(commands(fired)) == links
    trigger_entry = backing[compound_key("node-1", "eth9").encode()]
    assert len(trigger_entry) < 2_000, len(trigger_entry)
    assert max(len(v) for v in backing.values()) < 64_000
    restarted = Node()                                              # the table recovered, the offset not committed
    restarted.store = StateStore(restarted.det, backing)
    restarted.store.reload()                                       # as the app does after a rebalance
    assert restarted(trigger) == fired
    # ... and the firing's entries expire by themselves.
    later = restarted(rep(T0 + 30 * S + fired_log.KEEP_NS, True, 1, iface="eth9", backup=""))
    assert commands(later) == [] and not [k for k in backing if k.startswith(b'["fired"')]
