"""The node agent's link sources: netlink LinkSource (real veths in a network namespace) and IB sysfs ports."""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from clocktower.producers.agent.ib_sysfs import IbPortSource, parse_enum, parse_rate_mbps, read_ports
from clocktower.producers.agent.link_source import LinkSource, link_up, read_speed_mbps
from clocktower.schemas.event import Event
from clocktower.schemas.telemetry import LinkState
from tests.netns import namespace_with_veth


class Collector:
    """A thread-safe Emit that lets a test wait for a matching event."""

    def __init__(self) -> None:
        self.events: list[LinkState] = []
        self.cond = threading.Condition()

    def __call__(self, batch: list[Event]) -> None:
        with self.cond:
            self.events.extend(e for e in batch if isinstance(e, LinkState))
            self.cond.notify_all()

    def wait_for(self, pred: Callable[[LinkState], bool], start: int = 0, timeout: float = 5.0) -> LinkState:
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for ev in self.events[start:]:
                    if pred(ev):
                        return ev
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no matching event within {timeout} s; got {self.events[start:]}")
                self.cond.wait(left)

    def __len__(self) -> int:
        with self.cond:
            return len(self.events)


# -- netlink: pure message handling (no root needed) ----------------------------------------------------

def _msg(index: int, ifname: str, flags: int = 0x1, carrier: int = 1, operstate: str = "UP",
         changes: int = 1, event: str = "RTM_NEWLINK") -> dict:
    return {"event": event, "index": index, "ifname": ifname, "flags": flags, "carrier": carrier,
            "operstate": operstate, "carrier_changes": changes}


def test_link_messages_are_deduplicated_and_filtered() -> None:
    src = LinkSource("n1", netns="unused")           # netns set: no host sysfs speed read
    first = src._on_message(_msg(2, "eth0"), 10**18)
    assert first is not None and first.up and first.carrier and first.operstate == "up"
    assert src._on_message(_msg(2, "eth0"), 10**18 + 1) is None                       # nothing relevant changed
    down = src._on_message(_msg(2, "eth0", carrier=0, operstate="LOWERLAYERDOWN", changes=2), 10**18 + 2)
    assert down is not None and not down.up and not down.carrier and down.carrier_changes == 2
    assert src._on_message(_msg(1, "lo", flags=0x9, operstate="UNKNOWN"), 10**18) is None     # loopback
    gone = src._on_message(_msg(2, "eth0", event="RTM_DELLINK"), 10**18 + 3)
    assert gone is not None and gone.operstate == "deleted" and not gone.up
    only = LinkSource("n1", interfaces=["eth1"], netns="unused")
    assert only._on_message(_msg(2, "eth0"), 10**18) is None
    assert only._on_message(_msg(3, "eth1"), 10**18) is not None


def test_reports_carry_the_actuators_view_and_survive_it_failing() -> None:
    view = {"eth0": (True, False)}
    src = LinkSource("n1", netns="unused", actuator_view=lambda link: view[link])
    first = src._on_message(_msg(2, "eth0"), 10**18)
    assert first is not None and (first.on_backup, first.quarantined) == (True, False)
    view["eth0"] = (False, True)
    down = src._on_message(_msg(2, "eth0", carrier=0, operstate="DOWN", changes=2), 10**18 + 1)
    assert down is not None and (down.on_backup, down.quarantined) == (False, True)
    other = src._on_message(_msg(3, "eth9"), 10**18 + 2)         # the view raises KeyError: still reported
    assert other is not None and (other.on_backup, other.quarantined) == (None, None)
    plain = LinkSource("n1", netns="unused")._on_message(_msg(2, "eth0"), 10**18)
    assert plain is not None and (plain.on_backup, plain.quarantined) == (None, None)


def test_link_up_rule() -> None:
    assert link_up("up", True, True)
    assert link_up("unknown", True, True)            # dummy/tun style drivers
    assert not link_up("unknown", True, False)
    assert not link_up("up", False, True)            # never up while admin down
    assert not link_up("lowerlayerdown", True, True)


def test_speed_from_sysfs(tmp_path: Path) -> None:
    for name, text in (("eth0", "100000\n"), ("virtio", "-1\n"), ("bad", "x\n")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "speed").write_text(text)
    assert read_speed_mbps("eth0", tmp_path) == 100_000
    assert read_speed_mbps("virtio", tmp_path) == 0 and read_speed_mbps("bad", tmp_path) == 0
    assert read_speed_mbps("absent", tmp_path) == 0
    src = LinkSource("n1", sysfs_net=tmp_path)
    assert src._on_message(_msg(2, "eth0"), 10**18).speed_mbps == 100_000
    assert src._on_message(_msg(2, "eth0", carrier=0, operstate="DOWN", changes=2), 10**18).speed_mbps == 0


def test_link_check_reasons() -> None:
    missing = LinkSource("n1", netns=f"ct-no-such-ns-{os.getpid()}").check()
    assert not missing.ok and "does not exist" in missing.reason
    here = LinkSource("n1").check()
    assert here.ok, here.reason


# -- netlink: real veths in a network namespace ---------------------------------------------------------

@pytest.fixture
def veth_netns() -> Iterator[tuple[str, str, str]]:
    """A fresh network namespace holding a veth pair (both ends), removed afterwards whatever happens."""
    pid = os.getpid()
    a, b = f"cta{pid % 10**6}", f"ctb{pid % 10**6}"
    with namespace_with_veth(f"ctlinks{pid}", a, b) as ns:
        yield ns, a, b


def test_link_source_sees_down_and_up_in_netns(veth_netns: tuple[str, str, str]) -> None:
    from pyroute2 import IPRoute

    ns, a, b = veth_netns
    threads_before = set(threading.enumerate())
    src = LinkSource("node-7", netns=ns, report_interval_s=None)     # changes only: none expected below
    assert src.check().ok, src.check().reason
    got = Collector()
    with IPRoute(netns=ns, flags=0) as ip:
        ia, ib = ip.link_lookup(ifname=a)[0], ip.link_lookup(ifname=b)[0]
        # Wait for both ends to settle up (carrier comes a moment after admin up).
        deadline = time.monotonic() + 5
        while any(ip.link("get", index=i)[0].get("operstate") != "UP" for i in (ia, ib)):
            assert time.monotonic() < deadline, "veths did not come up"
            time.sleep(0.01)
        src.start(got)
        try:
            # Snapshot: both veths, no loopback, up with carrier.
            snap = {e.interface: e for e in got.events}
            assert set(snap) == {a, b}
            assert all(e.up and e.carrier and e.operstate == "up" and e.kind == "ethernet" and e.node == "node-7"
                       for e in snap.values())
            changes0 = snap[a].carrier_changes

            # Down: set b admin down; a loses its carrier.
            mark = len(got)
            t0 = time.time_ns()
            ip.link("set", index=ib, state="down")
            t1 = time.time_ns()
            a_down = got.wait_for(lambda e: e.interface == a and not e.carrier, mark)
            b_down = got.wait_for(lambda e: e.interface == b and e.operstate == "down", mark)
            t2 = time.time_ns()
            assert t0 <= a_down.ts_ns <= t2 and t0 <= b_down.ts_ns <= t2
            assert not a_down.up and a_down.operstate == "lowerlayerdown"
            assert a_down.carrier_changes > changes0
            assert not b_down.up
            down_delays = (a_down.ts_ns - t0, b_down.ts_ns - t0, t1 - t0)

            # Up again: a regains its carrier.
            mark = len(got)
            t0 = time.time_ns()
            ip.link("set", index=ib, state="up")
            t1 = time.time_ns()
            a_up = got.wait_for(lambda e: e.interface == a and e.up, mark)
            b_up = got.wait_for(lambda e: e.interface == b and e.up, mark)
            t2 = time.time_ns()
            assert t0 <= a_up.ts_ns <= t2 and t0 <= b_up.ts_ns <= t2
            assert a_up.carrier and a_up.operstate == "up"
            assert a_up.carrier_changes > a_down.carrier_changes
            up_delays = (a_up.ts_ns - t0, b_up.ts_ns - t0, t1 - t0)
            time.sleep(0.05)                            # let any trailing message of the up arrive

            # Irrelevant changes (MTU, alias) produce RTM_NEWLINK messages but no LinkState.
            mark = len(got)
            ip.link("set", index=ia, mtu=1400)
            ip.link("set", index=ia, ifalias="clocktower test")
            time.sleep(0.1)                             # events arrive in ~1-2 ms; 100 ms is plenty
            assert got.events[mark:] == []

            # Delay, over a few more down/up cycles: the kernel changes the link somewhere inside the
            # `ip link set` call [t0, t1], so ts - t0 bounds the delay from above and ts - t1 from below.
            samples: list[tuple[int, int]] = []
            for i in range(10):
                mark = len(got)
                want_up = i % 2 == 1
                t0 = time.time_ns()
                ip.link("set", index=ib, state="up" if want_up else "down")
                t1 = time.time_ns()
                ev = got.wait_for(lambda e, u=want_up: e.interface == a and e.carrier == u, mark)
                samples.append((ev.ts_ns - t0, ev.ts_ns - t1))
            time.sleep(0.05)

            # Deleting the pair reports both ends once as deleted.
            mark = len(got)
            ip.link("del", index=ia)
            for name in (a, b):
                gone = got.wait_for(lambda e, n=name: e.interface == n and e.operstate == "deleted", mark)
                assert not gone.up
        finally:
            t_stop = time.monotonic()
            src.stop()
            stop_s = time.monotonic() - t_stop
    assert stop_s < 1.0
    leftover = [t for t in set(threading.enumerate()) - threads_before if t.is_alive()]
    assert leftover == []
    assert src.counts["link_state"] == len(got)
    print(f"\nlink event delay (ts_ns - time before `ip link set`): "
          f"down: carrier {down_delays[0] / 1e6:.3f} ms, admin {down_delays[1] / 1e6:.3f} ms "
          f"(set call {down_delays[2] / 1e6:.3f} ms); "
          f"up: carrier {up_delays[0] / 1e6:.3f} ms, admin {up_delays[1] / 1e6:.3f} ms "
          f"(set call {up_delays[2] / 1e6:.3f} ms); stop {stop_s * 1e3:.1f} ms")
    after_start = [s[0] / 1e6 for s in samples]
    after_end = [s[1] / 1e6 for s in samples]
    print(f"carrier event over {len(samples)} flips: ts - (before set) median {statistics.median(after_start):.3f} ms,"
          f" max {max(after_start):.3f} ms; ts - (after set returned) median {statistics.median(after_end):.3f} ms,"
          f" max {max(after_end):.3f} ms")


def test_link_source_resyncs_after_overflow(veth_netns: tuple[str, str, str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A stalled source whose socket overflows (ENOBUFS) dumps again and ends with the true state."""
    from pyroute2 import IPRoute

    import clocktower.producers.agent.link_source as link_source

    ns, a, b = veth_netns
    monkeypatch.setattr(link_source, "RCVBUF", 1024)    # the kernel's minimum: a few messages overflow it
    got = Collector()
    stall = threading.Event()
    release = threading.Event()

    def emit(batch: list[Event]) -> None:
        if stall.is_set():
            release.wait(5)                             # the source's thread is stuck in a slow sink
        got(batch)

    src = LinkSource("node-7", interfaces=[a], netns=ns, report_interval_s=None)
    with IPRoute(netns=ns, flags=0) as ip:
        ib = ip.link_lookup(ifname=b)[0]
        src.start(emit)
        try:
            stall.set()
            for i in range(40):                         # ends with b up: a has its carrier
                ip.link("set", index=ib, state="up" if i % 2 else "down")
            truth = ip.link("get", index=ip.link_lookup(ifname=a)[0])[0]
            release.set()
            final = got.wait_for(lambda e: e.carrier_changes == truth.get("carrier_changes"))
            assert final.carrier and final.up and final.operstate == "up"
            assert src.resyncs >= 1
        finally:
            release.set()
            src.stop()


# -- InfiniBand sysfs ------------------------------------------------------------------------------------

def make_port(root: Path, dev: str, port: int, state: str = "4: ACTIVE", phys: str = "5: LinkUp",
              rate: str = "100 Gb/sec (4X EDR)", link_layer: str = "InfiniBand",
              counters: dict[str, int] | None = None) -> Path:
    p = root / dev / "ports" / str(port)
    (p / "counters").mkdir(parents=True, exist_ok=True)
    (p / "state").write_text(state + "\n")
    (p / "phys_state").write_text(phys + "\n")
    (p / "rate").write_text(rate + "\n")
    (p / "link_layer").write_text(link_layer + "\n")
    for name, value in (counters or {}).items():
        (p / "counters" / name).write_text(f"{value}\n")
    return p


FULL = {"port_xmit_data": 1000, "port_rcv_data": 2000, "port_xmit_packets": 30, "port_rcv_packets": 40,
        "port_rcv_errors": 1, "port_xmit_discards": 2, "symbol_error": 3, "link_downed": 4,
        "link_error_recovery": 5}


@pytest.fixture
def ib_root(tmp_path: Path) -> Path:
    root = tmp_path / "infiniband"
    make_port(root, "mlx5_0", 1, counters=FULL)
    make_port(root, "mlx5_1", 1, state="1: DOWN", phys="3: Disabled", rate="25 Gb/sec (1X EDR)",
              link_layer="Ethernet", counters={"port_xmit_data": 7, "port_rcv_packets": 9})
    (root / "mlx5_1" / "ports" / "1" / "counters" / "symbol_error").write_text("garbage\n")
    return root


def test_parse_sysfs_values() -> None:
    assert parse_enum("4: ACTIVE\n") == "ACTIVE"
    assert parse_enum("5: LinkUp") == "LinkUp"
    assert parse_enum("") == "unknown"
    assert parse_rate_mbps("100 Gb/sec (4X EDR)") == 100_000
    assert parse_rate_mbps("2.5 Gb/sec (1X SDR)") == 2_500
    assert parse_rate_mbps("400 Gb/sec (4X NDR)\n") == 400_000
    assert parse_rate_mbps("") == 0


def test_ib_ports_values_and_missing_counters(ib_root: Path) -> None:
    p0, p1 = read_ports(ib_root)
    assert (p0.name, p0.state, p0.up, p0.rate_mbps, p0.link_layer) == ("mlx5_0/1", "ACTIVE", True, 100_000,
                                                                        "InfiniBand")
    # data counters: 4-byte words in sysfs, bytes here; the rest as read
    assert p0.counters == {**FULL, "port_xmit_data": 4000, "port_rcv_data": 8000}
    assert (p1.name, p1.state, p1.up, p1.link_layer) == ("mlx5_1/1", "DOWN", False, "Ethernet")
    assert p1.counters["port_xmit_data"] == 28 and p1.counters["port_rcv_packets"] == 9
    assert p1.counters["port_rcv_data"] is None and p1.counters["link_downed"] is None  # missing file: not read
    assert p1.counters["symbol_error"] is None                                           # unparsable file

    e0, e1 = (p.to_event("node-3", 10**18) for p in (p0, p1))
    assert (e0.interface, e0.kind, e0.up, e0.carrier, e0.ib_state, e0.operstate) == (
        "mlx5_0/1", "infiniband", True, True, "ACTIVE", "LinkUp")
    assert e0.speed_mbps == 100_000 and e0.port_xmit_data == 4000 and e0.port_rcv_data == 8000
    assert e0.carrier_changes == 4 and e0.link_error_recovery == 5 and e0.symbol_error == 3
    assert not e1.up and not e1.carrier and e1.speed_mbps == 0 and e1.operstate == "Disabled"
    assert (e1.port_xmit_data, e1.port_rcv_data, e1.symbol_error, e1.link_downed) == (28, None, None, None)
    assert e1.carrier_changes == 0                    # link_downed never read: no change seen, not null


def test_ib_poll_reports_periodically_and_state_changes_at_once(ib_root: Path) -> None:
    src = IbPortSource("node-3", root=ib_root, interval_s=1.0, report_interval_s=10.0)
    first = src.poll(now=100.0)
    assert [e.interface for e in first] == ["mlx5_0/1", "mlx5_1/1"]
    assert src.poll(now=101.0) == []                    # nothing changed, no report due

    port = ib_root / "mlx5_1" / "ports" / "1"
    (port / "state").write_text("4: ACTIVE\n")
    (port / "phys_state").write_text("5: LinkUp\n")
    changed = src.poll(now=102.0)
    assert [(e.interface, e.up, e.ib_state, e.speed_mbps) for e in changed] == [("mlx5_1/1", True, "ACTIVE", 25_000)]
    assert src.state_changes == 1

    (port / "counters" / "port_xmit_data").write_text("100\n")   # counters alone: wait for the report
    assert src.poll(now=103.0) == []
    report = src.poll(now=110.0)
    assert len(report) == 2 and report[1].port_xmit_data == 400

    for f in sorted((ib_root / "mlx5_0").rglob("*"), reverse=True):      # the device vanishes
        f.unlink() if f.is_file() else f.rmdir()
    (ib_root / "mlx5_0").rmdir()
    gone = src.poll(now=111.0)
    assert [(e.interface, e.up, e.operstate) for e in gone] == [("mlx5_0/1", False, "deleted")]


def test_ib_check_reasons(tmp_path: Path, ib_root: Path) -> None:
    missing = IbPortSource("n", root=tmp_path / "nope").check()
    assert not missing.ok and str(tmp_path / "nope") in missing.reason and "InfiniBand" in missing.reason
    (tmp_path / "empty").mkdir()
    empty = IbPortSource("n", root=tmp_path / "empty").check()
    assert not empty.ok and "no RDMA devices" in empty.reason
    (tmp_path / "noports" / "mlx5_9").mkdir(parents=True)
    noports = IbPortSource("n", root=tmp_path / "noports").check()
    assert not noports.ok and "no ports" in noports.reason and "mlx5_9" in noports.reason
    ok = IbPortSource("n", root=ib_root).check()
    assert ok.ok and "mlx5_0/1" in ok.reason and "mlx5_1/1" in ok.reason


def test_ib_source_thread_emits_and_stops_promptly(ib_root: Path) -> None:
    threads_before = set(threading.enumerate())
    src = IbPortSource("node-3", root=ib_root, interval_s=0.02, report_interval_s=60.0)
    got = Collector()
    src.start(got)
    try:
        got.wait_for(lambda e: e.interface == "mlx5_1/1")
        mark = len(got)
        t0 = time.time_ns()
        staged = ib_root.parent / "state.staged"   # replaced whole, as sysfs reads are: never seen half-written
        staged.write_text("2: INIT\n")
        staged.replace(ib_root / "mlx5_0" / "ports" / "1" / "state")
        ev = got.wait_for(lambda e: e.interface == "mlx5_0/1" and e.ib_state == "INIT", mark)
        # a poll stamps its time before it reads the port: one that began just before t0 may read the new state
        assert ev.ts_ns >= t0 - int(src.interval_s * 1e9) and not ev.up
    finally:
        t_stop = time.monotonic()
        src.stop()
    assert time.monotonic() - t_stop < 0.5
    assert [t for t in set(threading.enumerate()) - threads_before if t.is_alive()] == []
    assert src.counts["link_state"] == len(got)


def test_link_source_reports_every_link_periodically(veth_netns: tuple[str, str, str]) -> None:
    """With nothing changing, each link's state is re-sent every report interval with a fresh timestamp."""
    from pyroute2 import IPRoute

    ns, a, b = veth_netns
    with IPRoute(netns=ns, flags=0) as ip:                     # settled first: no change during the test
        deadline = time.monotonic() + 5
        while any(ip.link("get", index=ip.link_lookup(ifname=n)[0])[0].get("operstate") != "UP" for n in (a, b)):
            assert time.monotonic() < deadline, "veths did not come up"
            time.sleep(0.01)
    src = LinkSource("node-7", netns=ns, report_interval_s=0.2)
    got = Collector()
    src.start(got)
    try:
        time.sleep(0.75)
    finally:
        src.stop()
    for name in (a, b):
        reports = [e for e in got.events if e.interface == name]
        assert len(reports) >= 3, reports                       # the snapshot plus >= 2 periodic reports
        assert len({(e.up, e.carrier, e.operstate, e.carrier_changes) for e in reports}) == 1
        stamps = [e.ts_ns for e in reports]
        assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps)
