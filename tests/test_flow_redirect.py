"""`redirect`: the low traffic class toward a congested destination leaves by the node's alternate port.

The kernel test builds two network namespaces joined by two veth pairs, each capped at 20 Mbit/s with tbf: the
primary path (routed) and its alternate. A bulk TCP stream in the low class and a high-priority UDP probe both go
to the receiver's primary address; the probe is marked high by the agent's own tc classifier (its `prio` map, as
the agent marks the collectives), which runs before the actuator's redirect filter. After `redirect`, the bulk
leaves by the alternate path at its full rate, the probe stays on the primary path (its arrival interface, from
IP_PKTINFO) and its delay comes back within budget; `resume` ends it.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from clocktower.actuators.actuator import Actuator
from clocktower.actuators.flow_redirector import MAX_DESTINATIONS, RedirectError, parse_destinations
from clocktower.actuators.hooks import Hooks
from clocktower.actuators.kernel_redirector import FILTER_PRIO, KernelRedirector
from clocktower.actuators.quarantine import Quarantine
from clocktower.actuators.seen_commands import SeenCommands
from clocktower.actuators.settings import parse_redirect_paths
from clocktower.actuators.simulated_redirector import SimulatedRedirector
from clocktower.actuators.simulated_shaper import SimulatedShaper
from clocktower.control.traffic_class import HIGH_CLASSID
from tests.control_keys import TEST_VERIFIER
from tests.failover_bed import in_netns
from tests.namespace_traffic import IP_PKTINFO, Traffic, bound
from tests.netns import shaped_paths
from tests.test_actuator import NODE, OWN_BACKUPS, Clock, RecordingRouting, S, _cmd


def _actuator(state: Path, shaper=None, redirector=None, clock: Clock | None = None) -> Actuator:  # noqa: ANN001
    clock = clock or Clock()
    return Actuator(NODE, TEST_VERIFIER, RecordingRouting(), SeenCommands(state, clock=clock),
                    Quarantine(state, clock=clock), Hooks({}), clock=clock, backups=OWN_BACKUPS.get, shaper=shaper,
                    lease_clock=clock, redirector=redirector)


def _redirect(dst: str = "10.0.0.2", ts: int = 0, **extra: str):  # noqa: ANN202
    return _cmd("redirect", "low", {"dst": dst, "share": "0.25", "toward": "node-b", "lease_s": "60", **extra},
                ts_ns=Clock().now + ts)


def test_a_redirect_moves_the_low_class_and_resume_ends_it(tmp_path: Path) -> None:
    shaper, redirector = SimulatedShaper(), SimulatedRedirector()
    act = _actuator(tmp_path, shaper, redirector)
    ack = act.handle(_redirect())
    assert (ack.status, ack.action) == ("applied", "redirect"), ack
    assert "moved to the alternate port" in ack.detail and "held 60 s" in ack.detail
    assert redirector.redirected() == {"10.0.0.2": "alternate port"} and shaper.low_share() is None   # not slowed
    ack = act.handle(_cmd("resume", "low", {"toward": "node-b"}, ts_ns=Clock().now + 1))
    assert ack.status == "applied" and "back on its routed port" in ack.detail and redirector.redirected() == {}


def test_without_an_alternate_path_a_redirect_slows_the_low_class_instead(tmp_path: Path) -> None:
    shaper = SimulatedShaper()
    for redirector in (None, SimulatedRedirector(alternate=None)):
        act = _actuator(tmp_path / str(id(redirector)), shaper, redirector)
        ack = act.handle(_redirect())
        assert ack.status == "applied" and "capped at 25%" in ack.detail and "instead" in ack.detail, ack
        assert shaper.low_share() == 0.25
        act.handle(_cmd("resume", "low", {"toward": "node-b"}, ts_ns=Clock().now + 1))
        assert shaper.low_share() == 1.0
    ack = _actuator(tmp_path / "none").handle(_redirect())
    assert ack.status == "refused" and "CLOCKTOWER_ACTUATOR_QOS_LINKS" in ack.detail
    ack = _actuator(tmp_path / "nopath", redirector=SimulatedRedirector(alternate=None)).handle(_redirect())
    assert ack.status == "refused" and "no traffic shaper to slow the low class instead" in ack.detail


class FailingRedirector(SimulatedRedirector):
    def redirect(self, destinations: list[str], holder: str, source: str | None = None) -> str:
        raise RedirectError("redirect failed: NetlinkError: (22, 'Invalid argument')")


def test_a_redirect_the_kernel_refuses_slows_the_low_class_instead(tmp_path: Path) -> None:
    shaper = SimulatedShaper()
    ack = _actuator(tmp_path, shaper, FailingRedirector()).handle(_redirect())
    assert ack.status == "applied" and "Invalid argument" in ack.detail and "capped at 25%" in ack.detail, ack


def test_once_a_path_is_found_the_cap_that_stood_in_for_it_is_lifted(tmp_path: Path) -> None:
    shaper, redirector = SimulatedShaper(), SimulatedRedirector(alternate=None)
    act = _actuator(tmp_path, shaper, redirector)
    assert "instead" in act.handle(_redirect(ts=0)).detail and shaper.low_share() == 0.25
    redirector.alternate = "eth1"                                         # the alternate came up
    ack = act.handle(_redirect(ts=1))
    assert "moved to the eth1" in ack.detail and "whole link again" in ack.detail, ack
    assert shaper.low_share() == 1.0 and redirector.redirected() == {"10.0.0.2": "eth1"}


def test_a_node_that_only_redirects_takes_resume_and_ends_what_a_refused_renewal_cannot_hold(tmp_path: Path) -> None:
    redirector = SimulatedRedirector()
    act = _actuator(tmp_path, None, redirector)
    assert act.handle(_redirect(ts=0)).status == "applied" and redirector.redirected()
    ack = act.handle(_cmd("resume", "low", {"toward": "node-b"}, ts_ns=Clock().now + 1))
    assert ack.status == "applied" and redirector.redirected() == {}, ack
    assert act.handle(_redirect(ts=2)).status == "applied" and redirector.redirected()
    redirector.alternate = None                                            # no path now, and no shaper to cap:
    ack = act.handle(_redirect(ts=3))                                      # refused, and nothing is left held
    assert ack.status == "refused" and redirector.redirected() == {} and "node-b" not in act.leases.until, ack


def test_a_redirect_whose_renewal_never_comes_ends_with_its_lease(tmp_path: Path) -> None:
    clock, redirector = Clock(), SimulatedRedirector()
    act = _actuator(tmp_path, SimulatedShaper(), redirector, clock)
    assert act.handle(_redirect(ts=0)).status == "applied"
    clock.now += 59 * S
    assert act.expire_leases() == [] and redirector.redirected()
    clock.now += 1 * S
    assert act.expire_leases() == ["node-b"] and redirector.redirected() == {}


@pytest.mark.parametrize(("dst", "why"), [
    ("", "no destination address"), ("node-b", "is not an IP address"), ("127.0.0.1", "not a routed unicast"),
    ("0.0.0.0", "not a routed unicast"), ("224.0.0.1", "not a routed unicast"), ("255.255.255.255", "not a routed"),
    ("169.254.0.7", "not a routed unicast"), ("fe80::1", "not a routed unicast"), ("fe80::1%eth0", "no scope"),
    ("::ffff:10.0.0.2", "no IPv4-mapped form"),
    (",".join(f"10.0.0.{i}" for i in range(1, MAX_DESTINATIONS + 2)), f"at most {MAX_DESTINATIONS}")])
def test_bad_destinations_are_refused(tmp_path: Path, dst: str, why: str) -> None:
    redirector = SimulatedRedirector()
    ack = _actuator(tmp_path, SimulatedShaper(), redirector).handle(_redirect(dst))
    assert ack.status == "refused" and why in ack.detail and redirector.redirected() == {}, ack


@pytest.mark.parametrize(("src", "why"), [
    ("10.0.0.1,10.0.0.3", "names 2 addresses; a redirect takes exactly one source"),
    ("node-a", "source 'node-a' is not an IP address"), ("127.0.0.1", "source 127.0.0.1 is not a routed unicast")])
def test_a_source_must_be_exactly_one_address(tmp_path: Path, src: str, why: str) -> None:
    """`src` picks the one address the redirected packets leave from: two were once taken as the first."""
    redirector = SimulatedRedirector()
    ack = _actuator(tmp_path, SimulatedShaper(), redirector).handle(_redirect(src=src))
    assert ack.status == "refused" and why in ack.detail and redirector.redirected() == {}, ack
    one = _actuator(tmp_path / "ok", SimulatedShaper(), redirector).handle(_redirect(src="10.0.0.1"))
    assert one.status == "applied", one


def test_destinations_and_paths_settings() -> None:
    assert parse_destinations(" 10.0.0.2, fd00::2 ") == ["10.0.0.2", "fd00::2"]
    assert parse_redirect_paths("eth0=eth1, eth1=eth0@10.2.0.254") == {"eth0": ("eth1", None),
                                                                     "eth1": ("eth0", "10.2.0.254")}
    assert parse_redirect_paths('{"ib0": ["ib1", null]}') == {"ib0": ("ib1", None)}
    for bad in ("eth0", "eth0=eth0", "eth0=eth1@gw", '{"eth0": 3}', "=eth1"):
        with pytest.raises(ValueError):
            parse_redirect_paths(bad)
    with pytest.raises(ValueError, match="its own alternate"):
        KernelRedirector({"eth0": ("eth0", None)})


# -- the kernel: two paths between network namespaces --------------------------------------------------------------

_RUN = os.getpid() % 100_000
A, B = f"ct-rd-a-{_RUN}", f"ct-rd-b-{_RUN}"
PRIMARY, ALTERNATE = "rd0", "rd1"
NET = {PRIMARY: "10.80.1", ALTERNATE: "10.80.2"}
RATE_MBIT = 20
PROBE_PORT, PROBE_SRC_PORT, BULK_PORT = 47101, 47102, 47103
BUDGET_MS = 2.0
BULK_STREAMS = 3


@contextlib.contextmanager
def two_paths() -> Iterator[None]:
    """A and B on two 20 Mbit/s paths (shaped on A's side); B takes the primary address's traffic on its alternate
    port (loose reverse-path filtering)."""
    with shaped_paths(A, B, NET, RATE_MBIT, tag=f"r{_RUN}"):
        in_netns(B, lambda: [Path(f"/proc/sys/net/ipv4/conf/{c}/rp_filter").write_text("0")
                             for c in ("all", "default", PRIMARY, ALTERNATE)])
        yield


def _index(ns: str, port: str) -> int:
    from pyroute2 import IPRoute

    with IPRoute(netns=ns, flags=0) as ipr:
        return ipr.link_lookup(ifname=port)[0]


def _our_filters(port: str) -> int:
    from pyroute2 import IPRoute

    with IPRoute(netns=A, flags=0) as ipr:
        return sum(1 for f in ipr.get_filters(index=ipr.link_lookup(ifname=port)[0], parent="ffff:fff3")
                   if f.get_attr("TCA_KIND") == "bpf" and f["info"] >> 16 == FILTER_PRIO and f["handle"])


def _kernel_ready() -> Path:
    from clocktower.runtime.bcc_build import bcc_problem, find_kernel_source

    if os.geteuid() != 0:
        pytest.skip("network namespaces, tc and BPF need root")
    problem = bcc_problem()
    headers, where = find_kernel_source()
    if problem or headers is None:
        pytest.skip(f"BCC cannot compile here: {problem or where}")
    return headers


def test_a_redirect_moves_the_bulk_to_the_alternate_path_and_the_high_class_delay_recovers(tmp_path: Path) -> None:
    from clocktower.producers.agent.ebpf.tc_classifier import TcClassifier

    headers = _kernel_ready()
    with two_paths():
        classifier = TcClassifier("node-a", [(A, PRIMARY)], headers)
        redirector = KernelRedirector({PRIMARY: (ALTERNATE, None)}, netns=A)
        traffic = Traffic(A, B, f"{NET[PRIMARY]}.2", BULK_PORT, PROBE_PORT, BULK_STREAMS,
                          probe_source=(f"{NET[PRIMARY]}.1", PROBE_SRC_PORT))   # unmarked: the agent marks it
        try:
            classifier.start()   # the agent marks the probe flow high, as it marks the collectives
            classifier.set_priority(f"{NET[PRIMARY]}.1", f"{NET[PRIMARY]}.2", PROBE_SRC_PORT, PROBE_PORT, "udp",
                                    HIGH_CLASSID)
            assert redirector.start() == f"redirect filter on {PRIMARY}"
            primary_in = _index(B, PRIMARY)
            traffic.start()
            quiet, _ = traffic.probes_after(time.monotonic() + 0.3, 1.0)
            traffic.bulk_on.set()
            t = time.monotonic() + 1.0
            congested, _ = traffic.probes_after(t, 1.0)
            shared_rate = traffic.bulk_mbit(t, 1.0)
            act = _actuator(tmp_path, SimulatedShaper(), redirector)
            ack = act.handle(_cmd("redirect", "low", {"dst": f"{NET[PRIMARY]}.2", "share": "0.25",
                                                       "toward": "b"}, ts_ns=Clock().now))
            assert ack.status == "applied" and f"from {PRIMARY} to {ALTERNATE}" in ack.detail, ack
            assert act.shaper.low_share() is None                       # moved, not slowed
            t = time.monotonic() + 0.5
            redirected, arrived_on = traffic.probes_after(t, 1.0)
            moved_rate = traffic.bulk_mbit(t, 1.0)
            moved = redirector.moved_packets()
            ack = act.handle(_cmd("resume", "low", {"toward": "b"}, ts_ns=Clock().now + 1))
            assert ack.status == "applied" and "back on its routed port" in ack.detail, ack
            assert redirector.redirected() == {}
            t = time.monotonic() + 1.0
            resumed, _ = traffic.probes_after(t, 1.0)
        finally:
            traffic.close()
            redirector.close()
            classifier.stop()
        assert _our_filters(PRIMARY) == 0                                # close() leaves nothing behind
    print(f"probe p50 ms: quiet {quiet:.3f}, congested {congested:.2f}, redirected {redirected:.3f}, resumed "
          f"{resumed:.2f}; bulk Mbit/s: {shared_rate:.1f} -> {moved_rate:.1f}; {moved} packets redirected")
    assert quiet < 1.0, quiet
    assert congested > 2 * BUDGET_MS, (quiet, congested)
    assert redirected < BUDGET_MS, (quiet, congested, redirected)
    assert arrived_on == {primary_in}, arrived_on                       # the high class kept its path
    assert moved > 100
    # the bulk has the alternate path to itself: about its whole rate, not a share of the primary's
    assert moved_rate > 0.7 * RATE_MBIT, (shared_rate, moved_rate)
    assert resumed > 2 * BUDGET_MS, resumed                              # back on the primary: congested again


def test_a_destination_routed_through_a_port_without_an_alternate_is_not_moved(tmp_path: Path) -> None:
    _kernel_ready()
    with two_paths():
        redirector = KernelRedirector({PRIMARY: (ALTERNATE, None)}, netns=A)
        try:
            redirector.start()
            shaper = SimulatedShaper()
            ack = _actuator(tmp_path, shaper, redirector).handle(_redirect(f"{NET[ALTERNATE]}.2"))
            assert ack.status == "applied" and f"routed through {ALTERNATE}, which has no alternate" in ack.detail
            assert "capped at 25%" in ack.detail and shaper.low_share() == 0.25 and redirector.redirected() == {}
            from pyroute2 import IPRoute

            act = _actuator(tmp_path / "down", shaper, redirector)
            assert "from rd0 to rd1" in act.handle(_redirect(f"{NET[PRIMARY]}.2", ts=1)).detail
            assert len(redirector.bpf[b"paths"]) == 1
            with IPRoute(netns=A, flags=0) as ipr:   # the alternate goes down: no path, and what was moved comes back
                ipr.link("set", index=ipr.link_lookup(ifname=ALTERNATE)[0], state="down")
            ack = act.handle(_redirect(f"{NET[PRIMARY]}.2", ts=2))
            assert f"its alternate {ALTERNATE} is down" in ack.detail and "capped at 25%" in ack.detail, ack
            assert redirector.redirected() == {} and len(redirector.bpf[b"paths"]) == 0
        finally:
            redirector.close()


def test_a_filter_left_by_an_actuator_that_died_is_replaced_empty_at_start() -> None:
    _kernel_ready()
    with two_paths():
        first = KernelRedirector({PRIMARY: (ALTERNATE, None)}, netns=A)
        first.start()
        assert f"from {PRIMARY} to {ALTERNATE}" in first.redirect([f"{NET[PRIMARY]}.2"], "b")
        first.bpf.cleanup()     # it dies: the kernel keeps its filter (and the program's map) attached
        first.bpf = None
        again = KernelRedirector({PRIMARY: (ALTERNATE, None)}, netns=A)
        try:
            assert again.start() == f"redirect filter on {PRIMARY} (replaced one left on {PRIMARY})"
            assert _our_filters(PRIMARY) == 1 and again.redirected() == {}
        finally:
            again.close()
        assert _our_filters(PRIMARY) == 0


def test_a_path_with_a_next_hop_delivers_the_low_class_on_the_alternate_port() -> None:
    _kernel_ready()
    with two_paths():
        redirector = KernelRedirector({PRIMARY: (ALTERNATE, f"{NET[ALTERNATE]}.2")}, netns=A)
        dst = f"{NET[PRIMARY]}.2"
        receiver = in_netns(B, lambda: bound(socket.SOCK_DGRAM, dst, PROBE_PORT))
        receiver.setsockopt(socket.IPPROTO_IP, IP_PKTINFO, 1)
        receiver.settimeout(1.0)
        try:
            redirector.start()
            assert f"from {PRIMARY} to {ALTERNATE}" in redirector.redirect([dst], "b", f"{NET[PRIMARY]}.1")

            def send() -> None:
                s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)   # priority 0: the low class
                for _ in range(20):
                    s.sendto(b"x" * 100, (dst, PROBE_PORT))
                    time.sleep(0.01)
                s.close()

            in_netns(A, send)
            arrived = []
            with contextlib.suppress(TimeoutError):
                while True:
                    _, anc, _, _ = receiver.recvmsg(2048, 64)
                    arrived += [struct.unpack("i", d[:4])[0] for _, typ, d in anc if typ == IP_PKTINFO]
            # (the first may wait in the neighbour queue while the next hop's address is resolved)
            assert len(arrived) >= 15 and set(arrived) == {_index(B, ALTERNATE)}, arrived
            assert redirector.moved_packets() >= len(arrived)
        finally:
            receiver.close()
            redirector.close()
