"""The clock-probe agent: wire format, pair ids, bad input, and real kernel-timestamped probes between processes.

The real tests run two agents in two processes (over loopback, and in two network namespaces joined by a
veth pair) that probe each other through the kernel for a few seconds. Both read the same host clock, so
the true offset is 0; the estimate from the minimum one-way delay in each direction,

    offset(b - a) = (min(rx_b - tx_a) - min(rx_a - tx_b)) / 2,

must land within OFFSET_BOUND_NS. Measured on the 2-vCPU Debian 12 VM (kernel 6.18, software
timestamps: SO_TIMESTAMPING RX, TX from the error queue), 20 runs each at 50 pairs/s for 3 s:
|offset| <= 15 ns over loopback and <= 20 ns over veth (minimum one-way delays 380-530 ns). The
ClockSynchronizer's estimate from the same probes: |offset| <= 56 ns (loopback), <= 89 ns (veth).
The bounds below leave a wide margin for a loaded CI machine.
"""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

from clocktower.producers.clock import timestamping, wire
from clocktower.producers.clock.probe_agent import PairIds, ProbeAgent, ProbeAgentConfig, ProbeAgentError
from clocktower.producers.clock.timestamping import TimestampedSocket, nic_timestamping
from clocktower.schemas.codec import decode_batch, encode_batch
from clocktower.schemas.telemetry import ClockProbe
from tests.netns import joined_namespaces

REPO = Path(__file__).resolve().parents[1]
KEY = b"test-only clock key, 32+ bytes long, never used elsewhere"
OFFSET_BOUND_NS = 500            # measured <= 20 ns (see the module docstring)
SYNC_BOUND_NS = 1_000            # ClockSynchronizer's estimate, measured <= 89 ns
RUN_S = 3.0
RATE = 50.0

try:
    from clocktower.streams.clocksync import ClockSynchronizer
except ImportError:             # written by another helper; the agent's test does not depend on it
    ClockSynchronizer = None


# -- wire format --------------------------------------------------------------------------------------------

def test_wire_round_trip() -> None:
    probe = wire.Probe("node-ä", 2**64 - 1, 1, 1_700_000_000_123_456_789)
    assert wire.decode(wire.encode_probe(probe, KEY), KEY) == probe
    assert len(wire.encode_probe(wire.Probe("node-0", 1, 0, 1), KEY)) == 46
    entries = tuple(wire.FollowUpEntry(i, 1_700_000_000_000_000_000 + i, None if i % 3 else 5)
                    for i in range(wire.MAX_FOLLOW_UP_ENTRIES))
    follow = wire.FollowUp("n" * 255, wire.TX_SOURCE_SOFTWARE, entries, 1_700_000_000_000_000_000)
    data = wire.encode_follow_up(follow, KEY)
    assert len(data) <= 1452                    # one datagram on a 1500-byte MTU, IPv4 or IPv6
    assert wire.decode(data, KEY) == follow
    only_second = wire.FollowUp("b", wire.TX_SOURCE_USERSPACE, (wire.FollowUpEntry(7, None, 42),), 3)
    assert wire.decode(wire.encode_follow_up(only_second, KEY), KEY) == only_second
    warm = wire.WarmUp("a", 5)
    assert wire.decode(wire.encode_warm_up(warm, KEY), KEY) == warm


def _seal(unsigned: bytes) -> bytes:
    """Re-MAC a datagram altered in a test, so that decode gets past the MAC to the defect under test."""
    return unsigned + wire.mac(KEY, unsigned)


def _probe_bytes() -> bytes:
    return wire.encode_probe(wire.Probe("a", 1, 0, 10), KEY)[:-wire.MAC_BYTES]


def _follow_bytes() -> bytes:
    return wire.encode_follow_up(wire.FollowUp("a", 0, (wire.FollowUpEntry(1, 10, 20),), 10), KEY)[:-wire.MAC_BYTES]


def _warm_bytes() -> bytes:
    return wire.encode_warm_up(wire.WarmUp("a", 10), KEY)[:-wire.MAC_BYTES]


@pytest.mark.parametrize(("data", "reason"), [
    (b"", "too short"),
    (b"CTCK\x02" + bytes(26), "too short"),
    (_seal(b"XXXX" + _probe_bytes()[4:]), "bad magic"),
    (_seal(_probe_bytes()[:4] + b"\x01" + _probe_bytes()[5:]), "unsupported version"),
    (_seal(_probe_bytes()[:5] + b"\x09" + _probe_bytes()[6:]), "unknown message type"),
    (_seal(_probe_bytes()[:-1]), "probe body is 7 bytes"),
    (_seal(_probe_bytes() + b"x"), "probe body is 9 bytes"),
    (_seal(_probe_bytes()[:7] + b"\x02" + _probe_bytes()[8:]), "idx 2"),
    (_seal(_probe_bytes()[:6] + b"\x00" + _probe_bytes()[7:]), "empty sender name"),
    (_seal(_probe_bytes()[:6] + b"\xff" + _probe_bytes()[7:]), "name length says more"),
    (_seal(_probe_bytes()[:16] + b"\xff" + _probe_bytes()[17:]), "not UTF-8"),
    (_seal(_probe_bytes()[:8] + b"\xff" * 8 + _probe_bytes()[16:]), "negative sent_ns"),
    (_seal(_follow_bytes()[:-1]), "count says"),
    (_seal(_follow_bytes()[:-1] + b"\x00"), "valid mask 0"),
    (_seal(_follow_bytes()[:-1] + b"\x04"), "valid mask 4"),
    (_seal(_follow_bytes()[:7] + b"\x07" + _follow_bytes()[8:]), "unknown tx_source"),
    (_seal(_follow_bytes()[:17] + b"\x00\x00"), "0 entries"),
    (_seal(_warm_bytes() + b"\x00"), "warm-up with a 1-byte body"),
    # Without the key's MAC, nothing past the version is even looked at.
    (_probe_bytes() + bytes(16), "bad MAC"),
    (wire.encode_probe(wire.Probe("a", 1, 0, 10), b"another key of at least thirty-two bytes"), "bad MAC"),
    (_seal(_probe_bytes())[:-1] + b"\x00", "bad MAC"),
])
def test_wire_rejects_malformed(data: bytes, reason: str) -> None:
    with pytest.raises(wire.WireError, match=reason):
        wire.decode(data, KEY)


def test_wire_mac_covers_every_byte() -> None:
    """Flipping any bit of a sealed probe (sender, pair id, stamp, idx, the tag itself) fails the MAC."""
    good = wire.encode_probe(wire.Probe("node-0", 123456789, 1, 1_700_000_000_000_000_000), KEY)
    for i in range(len(good)):
        for bit in (0, 7):
            bad = bytearray(good)
            bad[i] ^= 1 << bit
            with pytest.raises(wire.WireError):
                wire.decode(bytes(bad), KEY)


def test_wire_refuses_to_encode_bad_values() -> None:
    with pytest.raises(ValueError, match="idx"):
        wire.encode_probe(wire.Probe("a", 1, 2, 0), KEY)
    with pytest.raises(ValueError, match="64 unsigned"):
        wire.encode_probe(wire.Probe("a", 2**64, 0, 0), KEY)
    with pytest.raises(ValueError, match="UTF-8 bytes"):
        wire.encode_probe(wire.Probe("x" * 256, 1, 0, 0), KEY)
    with pytest.raises(ValueError, match="no TX timestamp"):
        wire.encode_follow_up(wire.FollowUp("a", 0, (wire.FollowUpEntry(1, None, None),), 0), KEY)
    with pytest.raises(ValueError, match="entries"):
        wire.encode_follow_up(wire.FollowUp("a", 0, tuple(wire.FollowUpEntry(i, 1, 2) for i in range(47)), 0), KEY)


# -- the socket layer ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("match", ["scm_ts_opt_id", "opt_id_counter"])
def test_kernel_tx_timestamps_are_matched_to_their_sends(match: str) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as peer:
        peer.bind(("127.0.0.1", 0))
        peer.settimeout(1.0)
        sock = TimestampedSocket(("127.0.0.1", 0))
        try:
            if sock.modes.tx == "userspace":
                pytest.skip(f"this kernel gives no TX timestamps: {sock.modes}")
            if match == "opt_id_counter":
                sock._downgrade_to_counter()      # what a kernel before 6.13 (no SCM_TS_OPT_ID) leads to
            sent = [sock.send(b"one", peer.getsockname())]
            sent += sock.send_pair((b"two", b"three"), peer.getsockname())
            sent.append(sock.send(b"four", peer.getsockname()))
            assert sock.modes.tx_match == match
            assert [peer.recv(64) for _ in range(4)] == [b"one", b"two", b"three", b"four"]
            stamps: dict[int, int] = {}
            deadline = time.monotonic() + 2
            while len(stamps) < 4 and time.monotonic() < deadline:
                stamps.update(sock.recv_tx_timestamps())
                time.sleep(0.01)
        finally:
            sock.close()
    keys = [key for key, _ in sent]
    assert keys == [0, 1, 2, 3] and sorted(stamps) == keys
    for key, user_ns in sent:                    # the kernel stamp follows the userspace reading before sendto
        assert 0 <= stamps[key] - user_ns < 100_000_000
    assert stamps[0] < stamps[1] < stamps[2] < stamps[3]


def test_control_messages_are_parsed() -> None:
    ts = struct.pack("=qq", 1_700_000_000, 123)
    assert timestamping.rx_timestamp([(socket.SOL_SOCKET, timestamping.SCM_TIMESTAMPNS, ts)], False) \
        == 1_700_000_000_000_000_123
    scm = struct.pack("=6q", 1_700_000_000, 5, 0, 0, 1_600_000_000, 7)
    assert timestamping.rx_timestamp([(socket.SOL_SOCKET, timestamping.SCM_TIMESTAMPING, scm)], False) \
        == 1_700_000_000_000_000_005
    assert timestamping.rx_timestamp([(socket.SOL_SOCKET, timestamping.SCM_TIMESTAMPING, scm)], True) \
        == 1_600_000_000_000_000_007
    assert timestamping.rx_timestamp([], False) is None
    err = struct.pack("=IBBBBII", 42, timestamping.SO_EE_ORIGIN_TIMESTAMPING, 0, 0, 0, 0, 99) + bytes(16)
    anc = [(socket.SOL_SOCKET, timestamping.SCM_TIMESTAMPING, scm), (socket.IPPROTO_IP, timestamping.IP_RECVERR, err)]
    assert timestamping.tx_timestamp(anc, False) == (99, 1_700_000_000_000_000_005)
    icmp = struct.pack("=IBBBBII", 111, 2, 3, 3, 0, 0, 0) + bytes(16)   # an ICMP error, not a timestamp
    assert timestamping.tx_timestamp([anc[0], (socket.IPPROTO_IP, timestamping.IP_RECVERR, icmp)], False) is None


# -- pair ids and configuration -----------------------------------------------------------------------------

def test_pair_ids_are_unique_across_agents_and_restarts() -> None:
    now = time.time_ns()
    first = PairIds(prefix=0xBEEF, now_ns=now)
    used = [first.next() for _ in range(1000)]
    assert all(i >> 48 == 0xBEEF for i in used)
    assert used == sorted(used) and len(set(used)) == 1000
    # A restart a millisecond later, even with the same prefix, starts past every id used before it
    # (the counter starts at the wall clock in microseconds and the agent sends far less than 1 pair/us).
    restarted = PairIds(prefix=0xBEEF, now_ns=now + 1_000_000)
    assert restarted.next() > used[-1]
    # Other agents draw other random prefixes.
    prefixes = {PairIds().prefix for _ in range(64)}
    assert len(prefixes) > 50


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"peers": ("10.0.0.1",)}, "bad peer address '10.0.0.1': expected host:port"),
    ({"peers": ("10.0.0.1:notaport",)}, "is not a number"),
    ({"peers": ("10.0.0.1:70000",)}, "out of range"),
    ({"peers": ("no.such.host.invalid:7373",)}, "bad peer address 'no.such.host.invalid:7373'"),
    ({"peers": ("[::1]:7373",)}, "bad peer address"),                    # an IPv6 peer for an IPv4 socket
    ({"bind": "127.0.0.1"}, "bad bind address"),
    ({"pairs_per_s": 0}, "pairs_per_s"),
    ({"pair_spacing_us": -1}, "pair_spacing_us"),
    ({"node": ""}, "node name"),
    ({"key": b"too short"}, "at least 32 bytes"),
    ({"bind": "0.0.0.0:7373"}, "every interface"),
    ({"bind": "[::]:7373"}, "every interface"),
])
def test_bad_configuration_is_a_clear_error(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        ProbeAgentConfig(**{"node": "a", "key": KEY, "bind": "127.0.0.1:0", **kwargs})


def test_the_default_bind_is_the_cluster_interface_never_every_interface() -> None:
    """Without --bind: 127.0.0.1 with no peers, the interface that reaches the first peer, or --interface's
    address; a wildcard only with allow_any_bind. (Before the fix the default was 0.0.0.0:7373.)"""
    assert ProbeAgentConfig(node="a", key=KEY).bind == "127.0.0.1:7373"
    assert ProbeAgentConfig(node="a", key=KEY, peers=("127.0.0.5:7373",)).bind == "127.0.0.1:7373"
    assert ProbeAgentConfig(node="a", key=KEY, interface="lo").bind == "127.0.0.1:7373"
    assert ProbeAgentConfig(node="a", key=KEY, bind="0.0.0.0:0", allow_any_bind=True).bind == "0.0.0.0:0"
    with pytest.raises(ValueError, match="no-such-if0"):
        ProbeAgentConfig(node="a", key=KEY, interface="no-such-if0")
    agent = ProbeAgent(ProbeAgentConfig(node="a", key=KEY, bind=None, peers=(f"127.0.0.1:{_free_udp_port()}",)),
                       lambda events: None)
    try:
        agent.start()
    except ProbeAgentError as exc:            # something else holds 127.0.0.1:7373 here
        assert "7373" in str(exc)
    else:
        assert agent.address == ("127.0.0.1", 7373)
        agent.stop()


def test_port_in_use_is_a_clear_error() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as busy:
        busy.bind(("127.0.0.1", 0))
        port = busy.getsockname()[1]
        agent = ProbeAgent(ProbeAgentConfig(node="a", key=KEY, bind=f"127.0.0.1:{port}"), lambda events: None)
        with pytest.raises(ProbeAgentError, match=f"cannot bind UDP 127.0.0.1:{port}: port already in use"):
            agent.start()
    with pytest.raises(ProbeAgentError, match="address not on this host"):
        ProbeAgent(ProbeAgentConfig(node="a", key=KEY, bind="192.0.2.1:0"), lambda events: None).start()


# -- one process: bad input and a failing sink never stop the agent -----------------------------------------

def test_agent_survives_garbage_and_a_failing_sink_and_stops_cleanly() -> None:
    delivered: list[ClockProbe] = []
    calls = 0

    def flaky_sink(events: list[ClockProbe]) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("broker away")
        delivered.extend(events)

    port_a = _free_udp_port()
    b = ProbeAgent(ProbeAgentConfig(node="b", key=KEY, bind="127.0.0.1:0", peers=(f"127.0.0.1:{port_a}",),
                                    probe_peers=0, flush_interval_s=0.1), flaky_sink).start()
    port_b = b.address[1]
    a = ProbeAgent(ProbeAgentConfig(node="a", key=KEY, bind=f"127.0.0.1:{port_a}", peers=(f"127.0.0.1:{port_b}",),
                                    pairs_per_s=100, pair_spacing_us=0), lambda events: None).start()
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as raw:
            for junk in (b"", b"hello", b"CTCK\x02\x01" + b"\x00" * 30, _seal(_probe_bytes()[:-1])):
                raw.sendto(junk, ("127.0.0.1", port_b))
            # A follow-up for a pair that never came: kept for join_timeout_s, then dropped.
            raw.sendto(wire.encode_follow_up(wire.FollowUp("x", 0, (wire.FollowUpEntry(1, 10, 20),), time.time_ns()),
                                             KEY), ("127.0.0.1", port_b))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (calls < 2 or not delivered):
            time.sleep(0.05)
    finally:
        a.stop()
        b.stop()
    counts = b.stats()["counts"]
    assert counts["malformed"] == 3 and counts["bad_mac"] == 1
    assert counts["sink_errors"] == 1
    assert delivered and all(e.node == "b" and e.sender == "a" and e.receiver == "b" for e in delivered)
    assert a.stats()["peers"] == [f"127.0.0.1:{port_b}"]
    assert a.failure is None and b.failure is None
    # Stopped means closed: the port can be bound again at once.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as again:
        again.bind(("127.0.0.1", port_b))
    b.stop()                                     # idempotent


@pytest.mark.parametrize("probe_back", [True, False])
def test_a_probed_agent_probes_back(probe_back: bool) -> None:
    """b lists a but chose not to probe it (K=0); once a probes it, b probes a too (both directions per edge),
    unless told not to."""
    at_a: list[ClockProbe] = []
    at_b: list[ClockProbe] = []
    port_a = _free_udp_port()
    b = ProbeAgent(ProbeAgentConfig(node="b", key=KEY, bind="127.0.0.1:0", flush_interval_s=0.1, pairs_per_s=50,
                                    peers=(f"127.0.0.1:{port_a}",), probe_peers=0, probe_back=probe_back),
                   at_b.extend).start()
    a = ProbeAgent(ProbeAgentConfig(node="a", key=KEY, bind=f"127.0.0.1:{port_a}",
                                    peers=(f"127.0.0.1:{b.address[1]}",), flush_interval_s=0.1, pairs_per_s=50),
                   at_a.extend).start()
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not (len(at_b) >= 20 and (len(at_a) >= 20 or not probe_back)):
            time.sleep(0.05)
        if not probe_back:
            time.sleep(0.5)
    finally:
        a.stop()
        b.stop()
    assert len(at_b) >= 20 and {e.sender for e in at_b} == {"a"}
    if probe_back:
        assert b.stats()["peers"] == [f"127.0.0.1:{a.address[1]}"]
        assert len(at_a) >= 20 and {(e.sender, e.receiver) for e in at_a} == {("b", "a")}
    else:
        assert b.stats()["peers"] == [] and at_a == []


def test_probe_back_stops_when_the_prober_goes_away() -> None:
    port_a = _free_udp_port()
    b = ProbeAgent(ProbeAgentConfig(node="b", key=KEY, bind="127.0.0.1:0", flush_interval_s=0.1, pairs_per_s=50,
                                    peers=(f"127.0.0.1:{port_a}",), probe_peers=0, probe_back_expiry_s=0.5),
                   lambda events: None).start()
    a = ProbeAgent(ProbeAgentConfig(node="a", key=KEY, bind=f"127.0.0.1:{port_a}",
                                    peers=(f"127.0.0.1:{b.address[1]}",), pairs_per_s=50), lambda events: None).start()
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not b.stats()["peers"]:
            time.sleep(0.05)
        assert b.stats()["peers"] == [f"127.0.0.1:{a.address[1]}"]
        a.stop()                                  # a leaves: b drops it after the expiry
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and b.stats()["peers"]:
            time.sleep(0.05)
        assert b.stats()["peers"] == [] and b.stats()["counts"]["probe_back_expired"] == 1
    finally:
        a.stop()
        b.stop()


# -- two processes, real probes through the kernel ----------------------------------------------------------

def _free_udp_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


_IN_NETNS = ("import sys; from pyroute2 import netns; netns.setns(sys.argv[1]); "
             "from clocktower.producers.clock.probe_agent import main; sys.exit(main(sys.argv[2:]))")


def _run_two_agents(tmp_path: Path, addr_a: str, addr_b: str, netns: tuple[str, str] | None = None,
                    ) -> tuple[dict[str, list[ClockProbe]], dict[str, dict]]:
    """Run agents a and b in two processes probing each other; their events and final stats."""
    key_file = tmp_path / "clock.key"
    key_file.write_bytes(KEY)
    key_file.chmod(0o600)
    procs = {}
    for name, own, peer, ns in (("a", addr_a, addr_b, netns[0] if netns else None),
                                ("b", addr_b, addr_a, netns[1] if netns else None)):
        args = ["--node", name, "--bind", own, "--peer", peer, "--rate", str(RATE), "--duration", str(RUN_S),
                "--stats-file", str(tmp_path / f"{name}.json"), "--key-file", str(key_file)]
        cmd = ([sys.executable, "-c", _IN_NETNS, ns, *args] if ns
               else [sys.executable, "-m", "clocktower.producers.clock.probe_agent", *args])
        procs[name] = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    events: dict[str, list[ClockProbe]] = {}
    stats: dict[str, dict] = {}
    for name, proc in procs.items():
        try:
            out, err = proc.communicate(timeout=RUN_S + 30)
        except subprocess.TimeoutExpired:
            for p in procs.values():
                p.kill()
            pytest.fail(f"agent {name} did not stop within {RUN_S + 30} s")
        assert proc.returncode == 0, f"agent {name} exited {proc.returncode}: {err}"
        events[name] = [ClockProbe.model_validate_json(line) for line in out.splitlines()]
        stats[name] = json.loads((tmp_path / f"{name}.json").read_text())
    return events, stats


def _check_exchange(events: dict[str, list[ClockProbe]], stats: dict[str, dict], label: str) -> None:
    for name, other in (("a", "b"), ("b", "a")):
        evs = events[name]
        # At 50 pairs/s for 3 s, both processes up for at least ~2 s of it.
        assert len(evs) >= 2 * RATE * 1.5, f"{label}: only {len(evs)} events at {name}"
        assert all(e.node == name and e.receiver == name and e.sender == other and e.ts_ns == e.rx_ns for e in evs)
        # Every event survives the Kafka codec: encode_batch / decode_batch validate it as a ClockProbe.
        key, value, headers = encode_batch(evs)
        assert decode_batch("telemetry.clock", key, value, headers).events == evs
        modes = stats[name]["modes"]
        assert modes["rx"] in ("software", "hardware") and modes["tx"] in ("software", "hardware"), \
            f"{label}: kernel timestamps not in use at {name}: {modes}"
        assert stats[name]["counts"].get("malformed", 0) == 0
        assert stats[name]["spacing_tx_ns"]["p50"] > 0

    d_ab = min(e.rx_ns - e.tx_ns for e in events["b"])        # probes a -> b, reported by b
    d_ba = min(e.rx_ns - e.tx_ns for e in events["a"])        # probes b -> a, reported by a
    offset = (d_ab - d_ba) / 2
    pure = {n: stats[n]["pure_fraction"] for n in "ab"}
    spacing = {n: stats[n]["spacing_tx_ns"]["p50"] for n in "ab"}
    print(f"\n{label}: modes {stats['a']['modes']}; min one-way delay a->b {d_ab} ns, b->a {d_ba} ns; "
          f"offset estimate {offset:+.1f} ns (bound {OFFSET_BOUND_NS}); pure-pair fraction {pure} "
          f"(|rx spacing - tx spacing| <= 2 us); median achieved pair spacing (kernel TX) {spacing} ns; "
          f"pairs sent/s {[stats[n]['pairs_sent_per_s'] for n in 'ab']}")
    for n in "ab":
        assert pure[n] is not None and 0.0 <= pure[n] <= 1.0
    assert 0 < d_ab < 1_000_000 and 0 < d_ba < 1_000_000
    assert abs(offset) <= OFFSET_BOUND_NS, f"{label}: offset estimate {offset} ns, true offset 0"

    if ClockSynchronizer is None:
        print(f"{label}: streams.clocksync.ClockSynchronizer not available; its estimate is not checked")
        return
    # The synchronizer keeps pure pairs only. Its default tolerance (100 ns) suits NIC timestamps; with
    # software timestamps on this VM, (rx1 - rx0) - (tx1 - tx0) has a median of about -0.4 us, so the
    # agent's own tolerance (2 us) is used.
    sync = ClockSynchronizer(window_ns=int((RUN_S + 2) * 1e9), pure_tolerance_ns=2_000)
    everything = sorted(events["a"] + events["b"], key=lambda e: e.rx_ns)
    for p in everything:
        sync.add_probe(p)
    now = everything[-1].rx_ns
    sync.update(now)
    at_a, at_b = sync.to_reference("a", now), sync.to_reference("b", now)
    assert at_a is not None and at_b is not None, f"{label}: no estimate, sync stats {sync.stats}"
    sync_offset = at_a[0] - at_b[0]
    print(f"{label}: ClockSynchronizer offset(b - a) {sync_offset:+d} ns, its error bound {at_b[1]} ns, "
          f"pure pairs {sync.stats['pure_pairs']} of {sync.stats['pairs']}")
    assert abs(sync_offset) <= SYNC_BOUND_NS


def _pure_fraction(events: list[ClockProbe], tolerance_ns: int) -> float:
    pairs: dict[int, dict[int, ClockProbe]] = defaultdict(dict)
    for e in events:
        pairs[e.pair_id][e.idx] = e
    full = [p for p in pairs.values() if len(p) == 2]
    pure = [p for p in full if abs((p[1].rx_ns - p[0].rx_ns) - (p[1].tx_ns - p[0].tx_ns)) <= tolerance_ns]
    return len(pure) / len(full) if full else 0.0


def test_two_processes_exchange_kernel_timestamped_probes_over_loopback(tmp_path: Path) -> None:
    addr_a, addr_b = f"127.0.0.1:{_free_udp_port()}", f"127.0.0.1:{_free_udp_port()}"
    events, stats = _run_two_agents(tmp_path, addr_a, addr_b)
    _check_exchange(events, stats, "loopback")
    # The agent's own pure-pair count agrees with one recomputed from the events it emitted.
    for n in "ab":
        assert abs(_pure_fraction(events[n], 2_000) - stats[n]["pure_fraction"]) <= 0.05


@pytest.fixture
def veth_namespaces() -> Iterator[tuple[str, str]]:
    """Two network namespaces joined by a veth pair, 10.213.0.1/24 <-> 10.213.0.2/24; removed afterwards."""
    with joined_namespaces("ctprobe", ("10.213.0.1", "10.213.0.2")) as (names, _links):
        yield names


def test_two_network_namespaces_exchange_probes_over_veth(tmp_path: Path, veth_namespaces: tuple[str, str]) -> None:
    events, stats = _run_two_agents(tmp_path, "10.213.0.1:7373", "10.213.0.2:7373", netns=veth_namespaces)
    _check_exchange(events, stats, "veth")


def test_nic_capabilities_are_readable() -> None:
    caps = nic_timestamping("lo")
    if caps is None:
        pytest.skip("SIOCETHTOOL ETHTOOL_GET_TS_INFO is not answered for lo here")
    assert caps.software_tx and not caps.hardware
    assert nic_timestamping("no-such-if0") is None
