"""The agent's local watchdog: unit tests on SimulatedRouting, and one real failover in network namespaces."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from clocktower.actuators.link_routing import LinkRouting, RoutingError
from clocktower.actuators.link_watchdog import LinkWatchdog
from clocktower.actuators.simulated_routing import SimulatedRouting
from clocktower.schemas.control import ControlAck
from clocktower.schemas.telemetry import LinkState


def state(interface: str, up: bool, ts_ns: int | None = None, link: str = "", backup: str = "") -> LinkState:
    return LinkState(node="n1", ts_ns=ts_ns if ts_ns is not None else time.time_ns(), interface=interface,
                     kind="ethernet", up=up, carrier_changes=0, speed_mbps=0, operstate="up" if up else "down",
                     carrier=up, link=link, backup=backup)


class Acks:
    def __init__(self) -> None:
        self.items: list[ControlAck] = []
        self.event = threading.Event()

    def __call__(self, ack: ControlAck) -> None:
        self.items.append(ack)
        self.event.set()


def make(delay_s: float, routing: LinkRouting | None = None) -> tuple[LinkWatchdog, SimulatedRouting, Acks]:
    sim = SimulatedRouting({"eth0", "eth1", "eth2"})
    acks = Acks()
    return LinkWatchdog("n1", routing or sim, {"eth0": "eth1"}, acks, delay_s=delay_s), sim, acks


def test_simulated_routing_semantics() -> None:
    sim = SimulatedRouting({"eth0", "eth1"})
    assert isinstance(sim, LinkRouting)
    assert sim.restore("eth0", "eth1") == "already on eth0"
    assert "moved" in sim.fail_over("eth0", "eth1") and sim.on_backup("eth0")
    assert sim.fail_over("eth0", "eth1") == "already on eth1"
    sim.set_link_up("eth0", False)
    with pytest.raises(RoutingError, match="eth0 is down"):
        sim.restore("eth0", "eth1")
    sim.set_link_up("eth0", True)
    assert "back" in sim.restore("eth0", "eth1") and not sim.on_backup("eth0")
    with pytest.raises(RoutingError, match="no interface 'eth9'"):
        sim.fail_over("eth9", "eth1")
    assert [op for op, _, _ in sim.history] == ["fail_over", "restore"]


def test_delay_zero_fails_over_at_once_in_the_calling_thread() -> None:
    wd, sim, acks = make(0.0)
    wd.observe(state("eth0", True))
    assert acks.items == []
    down_ts = time.time_ns()
    wd.observe(state("eth0", False, down_ts))
    assert sim.on_backup("eth0")               # synchronously: no thread was needed
    [ack] = acks.items
    assert (ack.status, ack.action, ack.target, ack.origin) == ("applied", "failover", "eth0", "watchdog")
    assert ack.command_id == f"watchdog:n1:eth0:{down_ts}"
    assert "moved" in ack.detail and ack.apply_ns > 0
    wd.observe(state("eth0", False))           # the periodic re-report of a down link: no second failover
    assert len(acks.items) == 1
    wd.stop()


def test_delay_fails_over_after_the_link_stays_down() -> None:
    wd, sim, acks = make(0.05)
    wd.observe(state("eth0", True))
    t0 = time.monotonic()
    wd.observe(state("eth0", False))
    assert not sim.on_backup("eth0")
    assert acks.event.wait(2.0)
    assert time.monotonic() - t0 >= 0.045
    assert sim.on_backup("eth0") and acks.items[0].status == "applied"
    wd.stop()


def test_carrier_back_within_the_delay_moves_nothing() -> None:
    wd, sim, acks = make(0.1)
    wd.observe(state("eth0", True))
    wd.observe(state("eth0", False))
    time.sleep(0.03)
    wd.observe(state("eth0", True))
    time.sleep(0.2)
    assert not sim.on_backup("eth0") and acks.items == [] and sim.history == []
    # a later down episode still fails over, and is reported once
    wd.observe(state("eth0", False))
    assert acks.event.wait(2.0)
    time.sleep(0.15)
    assert len(acks.items) == 1 and sim.on_backup("eth0")
    wd.stop()


def test_never_restores_and_each_down_episode_fails_over_once() -> None:
    wd, sim, acks = make(0.0)
    wd.observe(state("eth0", False))
    wd.observe(state("eth0", True))            # carrier back: the watchdog leaves it on the backup
    assert sim.on_backup("eth0")
    sim.restore("eth0", "eth1")                # the pipeline's restore
    wd.observe(state("eth0", False))
    assert sim.on_backup("eth0") and len(acks.items) == 2
    assert acks.items[0].command_id != acks.items[1].command_id


def test_delay_counts_from_the_event_time() -> None:
    wd, sim, acks = make(0.2)
    wd.observe(state("eth0", False, time.time_ns() - 150_000_000))   # read 150 ms ago: 50 ms are left
    assert acks.event.wait(0.15), "waited the full delay again instead of the rest of it"
    wd.stop()


def test_a_link_not_configured_fails_over_to_the_backup_its_reports_name() -> None:
    wd, sim, acks = make(0.0)
    wd.observe(state("eth2", True, backup="eth1"))
    wd.observe(state("eth2", False, backup="eth1"))    # the agent's topology named eth1 (config or routes)
    assert sim.on_backup("eth2") and [(a.target, a.status) for a in acks.items] == [("eth2", "applied")]
    wd.stop()


def test_links_without_backup_and_backups_themselves_are_ignored() -> None:
    wd, sim, acks = make(0.0)
    for name in ("eth1", "eth2"):
        wd.observe(state(name, False))
    assert acks.items == [] and sim.history == []
    wd.observe(state("mlx5_0/1", False, link="eth0"))       # an RDMA port reported as its netdev's link
    assert sim.on_backup("eth0") and acks.items[0].target == "eth0"


def test_routing_failure_is_reported_failed_and_the_watchdog_goes_on() -> None:
    class Broken(SimulatedRouting):
        def fail_over(self, link: str, backup: str) -> str:
            raise RoutingError("no interface 'eth1'")

    wd, _, acks = make(0.0, Broken())
    wd.observe(state("eth0", False))
    assert acks.items[0].status == "failed" and "no interface 'eth1'" in acks.items[0].detail
    assert wd.failures == 1


def test_a_raising_report_is_counted_and_does_not_propagate() -> None:
    sim = SimulatedRouting()

    def report(ack: ControlAck) -> None:
        raise RuntimeError("spool full")

    wd = LinkWatchdog("n1", sim, {"eth0": "eth1"}, report, delay_s=0)
    wd.observe(state("eth0", False))
    assert sim.on_backup("eth0") and wd.report_errors == 1


def test_stop_cancels_a_pending_failover() -> None:
    wd, sim, acks = make(0.1)
    wd.observe(state("eth0", False))
    wd.stop()
    time.sleep(0.2)
    assert acks.items == [] and not sim.on_backup("eth0")
    wd.observe(state("eth0", False))           # after stop: ignored
    assert acks.items == []


def test_remembers_routes_when_a_link_comes_up() -> None:
    class Recording(SimulatedRouting):
        remembered: list[str] = []

        def remember(self, link: str, backup: str) -> str:
            self.remembered.append(link)
            return "ok"

    rec = Recording()
    wd = LinkWatchdog("n1", rec, {"eth0": "eth1"}, Acks(), delay_s=0)
    wd.observe(state("eth0", True))
    wd.observe(state("eth0", True))            # periodic re-report: not again
    wd.observe(state("eth1", True))            # a backup port: not remembered
    assert rec.remembered == ["eth0"]


def test_link_source_listener_errors_are_counted_not_fatal() -> None:
    from clocktower.producers.agent.link_source import LinkSource

    seen: list[LinkState] = []

    def bad(_: LinkState) -> None:
        raise ValueError("boom")

    src = LinkSource("n1", listeners=[bad, seen.append])
    emitted: list[object] = []
    src._emit = emitted.extend
    src._send([state("eth0", True)])
    assert src.listener_errors == 1 and len(seen) == 1 and len(emitted) == 1


def test_local_failover_keeps_a_tcp_stream_through_a_hard_down(tmp_path: Path) -> None:
    """Real LinkSource + watchdog per host: a hard down of the primary loses and reorders no byte."""
    from tests.failover_bed import failover_bed

    with failover_bed("wdg") as bed, bed.agents(tmp_path, delay_s=0.05) as agents, bed.stream() as stream:
        stream.wait_bytes(200_000)
        down_ns = time.time_ns()
        bed.hard_down()
        flowing = bed.monitor.flow_start("b", bed.BACKUP, after_ns=down_ns, timeout_s=5.0)
        assert flowing is not None, "no traffic on the backup port after the primary went down"
        received = stream.received
        stream.wait_bytes(received + 500_000)
        assert all(a.routing.on_backup(bed.PRIMARY) for a in agents.values())
        acks = [ack for a in agents.values() for ack in a.acks]
        assert {(a.status, a.origin, a.target) for a in acks} == {("applied", "watchdog", bed.PRIMARY)}
        assert len(acks) == 2
    result = stream.result
    assert result.ok, result
    assert result.received == result.sent > 700_000


def test_carrier_loss_at_one_end_then_restore_resumes_on_the_primary_at_once(tmp_path: Path) -> None:
    """a loses carrier (b's end admin down): both fail over; after the restore traffic is back on the primary
    within 0.3 s (an unresolved ARP entry left from the outage held it ~0.9 s before restore flushed it)."""
    from tests.failover_bed import HOSTS, failover_bed

    with failover_bed("wdc") as bed, bed.agents(tmp_path, delay_s=0.0) as agents, bed.stream() as stream:
        stream.wait_bytes(200_000)
        down_ns = time.time_ns()
        bed.carrier_down("a")
        assert bed.monitor.flow_start("b", bed.BACKUP, after_ns=down_ns, timeout_s=5.0) is not None
        time.sleep(0.1)
        bed.carrier_up("a")
        for host in HOSTS:
            bed.wait_carrier(host, bed.PRIMARY, True)
        restore_ns = time.time_ns()
        for host in HOSTS:
            assert "restored 1 route(s)" in agents[host].routing.restore(bed.PRIMARY, bed.BACKUP)
        back = bed.monitor.flow_start("b", bed.PRIMARY, after_ns=restore_ns, timeout_s=5.0)
        assert back is not None and back - restore_ns < 300_000_000, (back, restore_ns)
        stream.wait_bytes(stream.received + 200_000)
    assert stream.result is not None and stream.result.ok, stream.result


def test_a_port_reported_by_two_interfaces_is_one_link() -> None:
    """RoCE: the netdev and its RDMA port report the same physical link at different times: one episode."""
    wd, sim, acks = make(0.0)
    wd.observe(state("eth0", True))
    wd.observe(state("mlx5_0/1", True, link="eth0"))
    wd.observe(state("eth0", False))
    wd.observe(state("mlx5_0/1", False, link="eth0"))      # the RDMA port's poll sees it later
    wd.observe(state("eth0", True))                          # netdev back, RDMA port not yet: still down
    sim.restore("eth0", "eth1")
    wd.observe(state("mlx5_0/1", False, link="eth0"))      # its periodic re-report
    assert len(acks.items) == 1 and not sim.on_backup("eth0")
    wd.observe(state("mlx5_0/1", True, link="eth0"))       # both up: the next down is a new episode
    wd.observe(state("mlx5_0/1", False, link="eth0"))
    assert len(acks.items) == 2 and sim.on_backup("eth0")
