"""Attacks on the clock probes (issue 8, item 7), as regressions: each one worked before the fix.

- Forgery: a node without the key claiming "node-0" with a 20 us bias moved an offset estimate by half
  the bias. Now every one of its datagrams is dropped and counted, and no event carries its pairs.
- Amplification: one 59-byte probe from a spoofed source made the agent send 404 datagrams there in
  13 s. Now probe-back sends a listed peer no more datagrams than it sent us.
- Exhaustion: anyone could fill the 64 probe-back slots and the 65,536-entry pending-pair table. Now
  only listed, authenticated sources create state, and pending pairs are bounded per sender.

Everything runs on loopback: Linux delivers the whole of 127.0.0.0/8 locally, so a test socket bound to
127.0.0.5 sends datagrams with that (spoofed) source and receives what the agent sends back there.
"""

from __future__ import annotations

import collections
import os
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from producers.clock import wire
from producers.clock.admission import Admission
from producers.clock.key import ClockKeyError, generate_key_file, load_key
from producers.clock.probe_agent import ProbeAgent, ProbeAgentConfig
from producers.clock.rate_limit import TokenBucket
from producers.clock.replay import ReplayGuard, SendClock
from schemas.telemetry import ClockProbe

REPO = Path(__file__).resolve().parents[1]
KEY = b"cluster key for the probe security tests (test only)"
WRONG_KEY = b"a forger's guess at the key, also 32 bytes or more"
BIAS_NS = 20_000
RATE = 50.0


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@contextmanager
def _udp(host: str, port: int = 0) -> Iterator[socket.socket]:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.bind((host, port))
        s.setblocking(False)
        yield s
    finally:
        s.close()


def _wait(condition: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def _drain(s: socket.socket) -> list[bytes]:
    out = []
    while True:
        try:
            out.append(s.recv(2048))
        except BlockingIOError:
            return out


def _v1_probe(sender: str, pair_id: int, idx: int, tx_ns: int) -> bytes:
    """The pre-fix wire format (version 1, no MAC), exactly as the forger of the issue sent it."""
    name = sender.encode()
    return struct.pack(">4sBBBBQq", b"CTCK", 1, 1, idx, len(name), pair_id, tx_ns) + name


def _v1_follow_up(sender: str, pair_id: int, tx0: int, tx1: int) -> bytes:
    name = sender.encode()
    return (struct.pack(">4sBBBBH", b"CTCK", 1, 2, 0, len(name), 1) + name
            + struct.pack(">QqqB", pair_id, tx0, tx1, 3))


def _agent(node: str, port: int, peers: tuple[str, ...], sink: Callable[[list[ClockProbe]], object],
           **kwargs: object) -> ProbeAgent:
    config = ProbeAgentConfig(node=node, key=KEY, bind=f"127.0.0.1:{port}", peers=peers, pairs_per_s=RATE,
                              flush_interval_s=0.1, **kwargs)  # type: ignore[arg-type]
    return ProbeAgent(config, sink).start()


# -- forgery --------------------------------------------------------------------------------------------------

def test_a_forger_without_the_key_claiming_node0_moves_nothing() -> None:
    """Genuine node-0 and node-1 probe each other while a forger, without the key, sends node-0 pairs whose
    follow-ups claim a TX time 20 us late (so the delay looks 20 us shorter), both in the old unsigned format
    and MACed with a wrong key, from node-0's IP and from an unlisted one. Before the fix this moved the
    offset estimate by ~10 us; now every forged datagram is counted as dropped and no event is forged."""
    p0, p1 = _free_port(), _free_port()
    at0: list[ClockProbe] = []
    at1: list[ClockProbe] = []
    node1 = _agent("node-1", p1, (f"127.0.0.1:{p0}",), at1.extend)
    node0 = _agent("node-0", p0, (f"127.0.0.1:{p1}",), at0.extend)
    forged_ids: set[int] = set()
    sent = collections.Counter[str]()
    stamps = SendClock()
    try:
        with _udp("127.0.0.1") as same_ip, _udp("127.0.0.9") as elsewhere:
            target = ("127.0.0.1", p1)
            deadline = time.monotonic() + 2.0
            pair_id = 0xF0F0_0000_0000_0000
            while time.monotonic() < deadline:
                pair_id += 1
                forged_ids.add(pair_id)
                tx0 = time.time_ns()
                biased = (tx0 + BIAS_NS, tx0 + BIAS_NS + 1_000)
                unsigned = [_v1_probe("node-0", pair_id, 0, tx0), _v1_probe("node-0", pair_id, 1, tx0),
                            _v1_follow_up("node-0", pair_id, *biased)]
                wrong = [wire.encode_probe(wire.Probe("node-0", pair_id, i, stamps.stamp()), WRONG_KEY) for i in (0, 1)]
                wrong.append(wire.encode_follow_up(wire.FollowUp(
                    "node-0", 0, (wire.FollowUpEntry(pair_id, *biased),), stamps.stamp()), WRONG_KEY))
                for data in unsigned:
                    same_ip.sendto(data, target)
                    sent["malformed"] += 1
                for data in wrong:
                    same_ip.sendto(data, target)
                    sent["bad_mac"] += 1
                for data in unsigned + wrong:
                    elsewhere.sendto(data, target)
                    sent["unlisted_source"] += 1
                time.sleep(1 / RATE)
        assert _wait(lambda: sum(node1.stats()["counts"].get(k, 0) for k in sent) >= sum(sent.values()), 5)
    finally:
        node0.stop()
        node1.stop()
    counts = node1.stats()["counts"]
    assert {k: counts.get(k, 0) for k in sent} == dict(sent), counts
    assert not forged_ids & {e.pair_id for e in at1}, "a forged pair became an event"
    assert len(at1) >= 2 * RATE and len(at0) >= 2 * RATE          # the genuine exchange went on
    d01 = min(e.rx_ns - e.tx_ns for e in at1)
    d10 = min(e.rx_ns - e.tx_ns for e in at0)
    offset = (d01 - d10) / 2
    assert abs(offset) < BIAS_NS / 8, f"offset estimate {offset} ns moved (true offset 0)"


def test_replayed_and_stale_datagrams_are_dropped() -> None:
    """A valid datagram sent twice, or one stamped outside the replay window, is counted and not used."""
    p1 = _free_port()
    with _udp("127.0.0.1") as sender:
        at1: list[ClockProbe] = []
        node1 = _agent("node-1", p1, (f"127.0.0.1:{sender.getsockname()[1]}",), at1.extend, probe_back=False,
                       replay_window_s=5.0)
        try:
            now = time.time_ns()
            probes = [wire.encode_probe(wire.Probe("node-0", 7, i, now + i), KEY) for i in (0, 1)]
            follow = wire.encode_follow_up(wire.FollowUp("node-0", 0, (wire.FollowUpEntry(7, now, now + 1),),
                                                         now + 2), KEY)
            stale = wire.encode_probe(wire.Probe("node-0", 8, 0, now - 60 * 10**9), KEY)
            for data in (*probes, follow, probes[0], follow, stale):
                sender.sendto(data, ("127.0.0.1", p1))
            assert _wait(lambda: node1.stats()["counts"].get("stale", 0) == 1, 5)
            assert _wait(lambda: len(at1) == 2, 5)
        finally:
            node1.stop()
    counts = node1.stats()["counts"]
    assert counts["replayed"] == 2 and counts["stale"] == 1 and counts["pairs_joined"] == 1
    assert sorted(e.idx for e in at1) == [0, 1] and {e.pair_id for e in at1} == {7}


# -- amplification --------------------------------------------------------------------------------------------

def test_one_spoofed_probe_from_a_listed_address_gets_no_amplification() -> None:
    """One valid probe from a listed peer's address (that peer runs no agent: the source is spoofed) used to
    make the agent probe that address back at full rate for 10 s (~375x). Now it sends at most as many
    datagrams as it received."""
    victim_port = _free_port("127.0.0.5")
    p1 = _free_port()
    with _udp("127.0.0.5", victim_port) as victim:
        node1 = _agent("node-1", p1, (f"127.0.0.5:{victim_port}",), lambda events: None, probe_peers=0)
        try:
            probe = wire.encode_probe(wire.Probe("node-0", 99, 0, time.time_ns()), KEY)
            victim.sendto(probe, ("127.0.0.1", p1))
            assert _wait(lambda: node1.stats()["probed_back"] == 1, 5)
            time.sleep(2.0)                             # 100 pairs' worth at 50 pairs/s
            got = _drain(victim)
        finally:
            node1.stop()
    counts = node1.stats()["counts"]
    assert len(got) <= 1 and sum(map(len, got)) <= len(probe), \
        f"{len(got)} datagrams ({sum(map(len, got))} bytes) sent back for one {len(probe)}-byte probe"
    assert counts["probe_back_no_credit"] >= 20                 # ~100 pairs were due; a stall may skip some


def test_probe_back_goes_only_to_listed_host_and_port() -> None:
    """A valid probe from a listed IP but an unlisted port is used, but never probed back."""
    listed, p1 = _free_port(), _free_port()
    with _udp("127.0.0.1") as other_port:
        node1 = _agent("node-1", p1, (f"127.0.0.1:{listed}",), lambda events: None, probe_peers=0)
        try:
            other_port.sendto(wire.encode_probe(wire.Probe("node-0", 5, 0, time.time_ns()), KEY), ("127.0.0.1", p1))
            assert _wait(lambda: node1.stats()["counts"].get("probe_back_unlisted", 0) == 1, 5)
            time.sleep(0.3)
            assert _drain(other_port) == [] and node1.stats()["probed_back"] == 0
        finally:
            node1.stop()


# -- exhaustion -----------------------------------------------------------------------------------------------

def test_unauthenticated_floods_take_no_slot_and_no_table_entry() -> None:
    """Probes from 150 unlisted sources, and 1000 distinct pairs MACed with a wrong key from a listed IP,
    take no probe-back slot and leave no pending pair (before: 64 slots and the 65,536-entry table filled).
    1150 datagrams fit in the agent's socket buffer, so none is lost even if the agent is slow to read."""
    listed, p1 = _free_port(), _free_port()
    node1 = _agent("node-1", p1, (f"127.0.0.1:{listed}",), lambda events: None, probe_peers=0)
    try:
        now = time.time_ns()
        for i in range(150):
            with _udp(f"127.0.{1 + i // 200}.{10 + i % 200}") as spoofed:
                spoofed.sendto(wire.encode_probe(wire.Probe(f"n{i}", i, 0, now + i), KEY), ("127.0.0.1", p1))
        with _udp("127.0.0.1") as same_ip:
            for i in range(1000):
                same_ip.sendto(wire.encode_probe(wire.Probe("node-0", i, 0, now + i), WRONG_KEY), ("127.0.0.1", p1))
        assert _wait(lambda: node1.stats()["counts"].get("bad_mac", 0) + node1.stats()["counts"].get(
            "unlisted_source", 0) >= 1150, 10)
        stats = node1.stats()
    finally:
        node1.stop()
    assert stats["counts"]["unlisted_source"] == 150 and stats["counts"]["bad_mac"] == 1000
    assert stats["probed_back"] == 0 and stats["pending_pairs"] == 0 and stats["peers"] == []
    assert "probes_received" not in stats["counts"]


def test_a_flooding_key_holder_is_rate_limited_and_cannot_fill_the_pending_table() -> None:
    """A listed node with the key floods distinct pair ids: its token bucket drops most (what it lets through
    stays within burst + rate x time, whatever the kernel dropped), its pending pairs stay under the
    per-sender bound, and another node's pairs are still joined meanwhile."""
    flood_port, p0, p1 = _free_port(), _free_port(), _free_port()
    at1: list[ClockProbe] = []
    node1 = _agent("node-1", p1, (f"127.0.0.1:{flood_port}", f"127.0.0.1:{p0}"), at1.extend, probe_peers=0,
                   max_pending_per_sender=100)
    node0 = _agent("node-0", p0, (f"127.0.0.1:{p1}",), lambda events: None)
    stamps = SendClock()
    try:
        assert _wait(lambda: len(at1) >= 10, 5)
        received_before = node1.stats()["counts"]["probes_received"]
        t0 = time.monotonic()
        with _udp("127.0.0.1", flood_port) as flooder:
            for i in range(4000):
                flooder.sendto(wire.encode_probe(wire.Probe("flooder", i, 0, stamps.stamp()), KEY), ("127.0.0.1", p1))
                if i % 100 == 99:
                    time.sleep(0.01)                    # at most ~10,000 datagrams/s, 20x the default limit
            before = len(at1)
            assert _wait(lambda: node1.stats()["counts"].get("rate_limited", 0) >= 1000, 5)
            time.sleep(0.2)
            stats = node1.stats()
            elapsed = time.monotonic() - t0
            assert _wait(lambda: len(at1) >= before + 20, 5), "node-0's pairs stopped being joined"
    finally:
        node0.stop()
        node1.stop()
    limit = node1.config.datagrams_per_s                          # burst = one second's worth
    let_in = stats["counts"]["probes_received"] - received_before
    assert let_in <= limit + limit * elapsed + 2 * RATE * elapsed + 10, (let_in, elapsed)   # + node-0's own
    assert stats["pending_pairs"] <= 100 + 2 * RATE               # the flooder's bound + node-0's in flight
    assert {e.sender for e in at1} == {"node-0"}


def test_pending_pairs_are_bounded_per_sender() -> None:
    """With the rate limit out of the way, one sender's half-joined pairs stop at max_pending_per_sender."""
    flood_port, p1 = _free_port(), _free_port()
    node1 = _agent("node-1", p1, (f"127.0.0.1:{flood_port}",), lambda events: None, probe_peers=0,
                   max_pending_per_sender=50, max_datagrams_per_s=1e6, probe_back=False)
    stamps = SendClock()
    try:
        with _udp("127.0.0.1", flood_port) as flooder:
            for i in range(500):
                flooder.sendto(wire.encode_probe(wire.Probe("flooder", i, 0, stamps.stamp()), KEY), ("127.0.0.1", p1))
            assert _wait(lambda: node1.stats()["counts"].get("probes_received", 0) >= 500, 5)
            stats = node1.stats()
    finally:
        node1.stop()
    assert stats["pending_pairs"] == 50 and stats["counts"]["pending_sender_overflow"] == 450


# -- the pieces, without sockets ------------------------------------------------------------------------------

def test_replay_guard_accepts_new_stamps_once_and_tolerates_small_reordering() -> None:
    now = 1_700_000_000 * 10**9
    g = ReplayGuard(window_ns=10**9, keep=4)
    assert g.check("a", now, now) is None
    assert g.check("a", now, now) == "replayed"
    assert g.check("a", now + 3, now) is None
    assert g.check("a", now + 2, now) is None                    # reordered, still new: accepted once
    assert g.check("a", now + 2, now) == "replayed"
    assert g.check("a", now - 1, now) == "replayed"              # older than anything remembered
    assert g.check("b", now, now) is None                        # per sender
    assert g.check("a", now + 2 * 10**9, now) == "stale"
    assert g.check("a", now - 2 * 10**9, now) == "stale"
    for i in range(4, 10):
        assert g.check("a", now + i, now) is None
    assert g.check("a", now + 3, now) == "replayed"              # fell out of the 4 kept: too old to tell
    small = ReplayGuard(window_ns=10**9, max_senders=2)
    for sender in "xyz":
        small.check(sender, now, now)
    assert len(small) == 2
    clock = SendClock()
    stamps = [clock.stamp() for _ in range(1000)]
    assert stamps == sorted(set(stamps))                          # strictly increasing


def test_token_bucket() -> None:
    b = TokenBucket(rate=10, burst=5, now_ns=0)
    assert [b.take(0) for _ in range(6)] == [True] * 5 + [False]
    assert b.take(100_000_000) and not b.take(100_000_000)       # 0.1 s refills one token
    assert sum(b.take(10**9 + i) for i in range(20)) == 5         # never more than the burst


def test_admission_checks_source_then_mac_and_keeps_no_state_for_refusals() -> None:
    counts: collections.Counter[str] = collections.Counter()
    adm = Admission(KEY, [("10.0.0.2", 7373)], 10**10, rate_per_s=100, burst=2, counts=counts)
    good = wire.encode_probe(wire.Probe("n2", 1, 0, time.time_ns()), KEY)
    assert adm.admit(good, ("10.0.0.3", 7373)) is None                       # unlisted IP: not even decoded
    assert adm.admit(good[:-1] + bytes([good[-1] ^ 1]), ("10.0.0.2", 7373)) is None
    assert adm.admit(b"junk", ("10.0.0.2", 7373)) is None
    assert len(adm._replay) == 0 and not adm._buckets                        # nothing kept for any of them
    assert adm.admit(good, ("10.0.0.2", 7373)) == wire.decode(good, KEY)
    assert adm.admit(good, ("10.0.0.2", 7373)) is None                       # the same datagram again
    assert adm.listed(("10.0.0.2", 7373)) and not adm.listed(("10.0.0.2", 7374))
    for i in range(2, 6):
        adm.admit(wire.encode_probe(wire.Probe("n2", i, 0, time.time_ns()), KEY), ("10.0.0.2", 7373), now_ns=0)
    assert counts == {"unlisted_source": 1, "bad_mac": 1, "malformed": 1, "replayed": 1, "rate_limited": 3}


# -- the key file ---------------------------------------------------------------------------------------------

def test_key_files_are_generated_private_and_checked(tmp_path: Path) -> None:
    path = generate_key_file(tmp_path / "clock.key")
    assert path.stat().st_mode & 0o777 == 0o600 and len(load_key(path)) == 64
    assert generate_key_file(tmp_path / "other.key").read_bytes() != path.read_bytes()   # random, not built in
    with pytest.raises(ClockKeyError, match="already exists"):
        generate_key_file(path)
    with pytest.raises(ClockKeyError, match="does not exist"):
        load_key(tmp_path / "missing")
    link = tmp_path / "link.key"
    link.symlink_to(path)
    with pytest.raises(ClockKeyError, match="symlink"):
        load_key(link)
    with pytest.raises(ClockKeyError, match="symlink|exists"):
        generate_key_file(link)
    short = tmp_path / "short.key"
    short.write_bytes(b"x" * 31)
    short.chmod(0o600)
    with pytest.raises(ClockKeyError, match="31 bytes"):
        load_key(short)
    path.chmod(0o640)
    with pytest.raises(ClockKeyError, match="chmod 600"):
        load_key(path)
    path.chmod(0o600)
    if os.geteuid() == 0:                       # only root can give a file to another user
        os.chown(path, 4321, 4321)
        with pytest.raises(ClockKeyError, match="owned by uid 4321"):
            load_key(path)


def test_the_standalone_agent_refuses_to_run_without_a_key(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "CLOCKTOWER_CLOCK_KEY_FILE"}
    cmd = [sys.executable, "-m", "producers.clock.probe_agent", "--node", "a", "--duration", "0.2"]
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "no clock key" in r.stderr
    r = subprocess.run(cmd + ["--gen-key", str(tmp_path / "k")], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and len(load_key(tmp_path / "k")) == 64
    r = subprocess.run(cmd + ["--bind", "0.0.0.0:0"], cwd=REPO, capture_output=True, text=True, timeout=60,
                       env={**env, "CLOCKTOWER_CLOCK_KEY_FILE": str(tmp_path / "k")})
    assert r.returncode == 2 and "every interface" in r.stderr
