"""QoS commands on the node: rate_limit, pause and resume of the low traffic class, through a TrafficShaper.

The kernel test builds two network namespaces joined by a veth pair whose sending end is capped at 20 Mbit/s with
tbf (the link's capacity). A bulk TCP stream in the low class fills the queue, and a high-priority UDP probe
(skb->priority 1:10, as the agent's classifier marks the collectives; here SO_PRIORITY) measures its one-way delay
(both ends share the host's clock, so the delay is exact). After the actuator's `rate_limit` of the low class,
the probe's delay comes back within its budget, and the bulk streams get about the quarter of the link they were
limited to; `resume` removes the shaping.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from clocktower.actuators.actuator import LEFTOVER, Actuator
from clocktower.actuators.hooks import Hooks
from clocktower.actuators.kernel_shaper import KernelShaper
from clocktower.actuators.quarantine import Quarantine
from clocktower.actuators.seen_commands import SeenCommands
from clocktower.actuators.settings import ActuatorSettings, parse_qos_links
from clocktower.actuators.simulated_shaper import SimulatedShaper
from clocktower.control.traffic_class import HIGH_CLASSID, LOW_CLASSID, traffic_class
from tests.control_keys import TEST_VERIFIER
from tests.failover_bed import in_netns
from tests.namespace_traffic import Traffic
from tests.netns import shaped_paths
from tests.test_actuator import NODE, OWN_BACKUPS, Clock, RecordingRouting, S, _cmd


def _actuator(state: Path, shaper=None, clock: Clock | None = None) -> Actuator:  # noqa: ANN001
    clock = clock or Clock()
    return Actuator(NODE, TEST_VERIFIER, RecordingRouting(), SeenCommands(state, clock=clock),
                    Quarantine(state, clock=clock), Hooks({}), clock=clock, backups=OWN_BACKUPS.get, shaper=shaper,
                    lease_clock=clock)


def test_the_classes_of_skb_priorities() -> None:
    assert (HIGH_CLASSID, LOW_CLASSID) == (0xC70010, 0xC70020)
    assert [traffic_class(p) for p in (None, 0, 2, 3, 6, HIGH_CLASSID, LOW_CLASSID, 0x10010)] == [
        "low", "low", "low", "high", "high", "high", "low", "high"]


def test_rate_limit_pause_and_resume_go_through_the_shaper(tmp_path: Path) -> None:
    shaper = SimulatedShaper()
    act = _actuator(tmp_path, shaper)
    ack = act.handle(_cmd("rate_limit", "low", {"share": "0.25", "toward": "node-b"}, ts_ns=Clock().now))
    assert (ack.status, ack.action, ack.detail) == ("applied", "rate_limit",
                                                    "low class capped at 25% of the link (held 60 s unless renewed)")
    assert shaper.low_share() == 0.25
    assert act.handle(_cmd("pause", "low", {"toward": "node-b"}, ts_ns=Clock().now + 1)).status == "applied"
    assert shaper.low_share() == 0.0
    ack = act.handle(_cmd("resume", "low", {"toward": "node-b"}, ts_ns=Clock().now + 2))
    assert ack.status == "applied" and shaper.low_share() == 1.0


def test_one_links_resume_keeps_the_limit_another_link_holds(tmp_path: Path) -> None:
    shaper = SimulatedShaper()
    act = _actuator(tmp_path, shaper)
    now = Clock().now
    act.handle(_cmd("pause", "low", {"toward": "node-b"}, ts_ns=now))
    act.handle(_cmd("rate_limit", "low", {"share": "0.5", "toward": "node-c"}, ts_ns=now + 1))
    assert shaper.low_share() == 0.0                       # a rate limit does not undo another link's pause
    ack = act.handle(_cmd("resume", "low", {"toward": "node-b"}, ts_ns=now + 2))
    assert shaper.low_share() == 0.5 and "still capped at 50%" in ack.detail
    act.handle(_cmd("resume", "low", {"toward": "node-c"}, ts_ns=now + 3))
    assert shaper.low_share() == 1.0


def test_a_limit_whose_renewal_never_comes_is_lifted_when_its_lease_runs_out(tmp_path: Path) -> None:
    """A lost `resume` (a streams worker that died before sending it) must not cap the node's bulk traffic for
    good: the limit holds for its lease, each renewal extends it, and another link's limit is kept."""
    shaper, clock = SimulatedShaper(), Clock()
    act = _actuator(tmp_path, shaper, clock)
    t = clock.now
    act.handle(_cmd("rate_limit", "low", {"share": "0.25", "toward": "node-b", "lease_s": "60"}, ts_ns=t))
    act.handle(_cmd("pause", "low", {"toward": "node-c"}, ts_ns=t + 1))           # no lease_s: the default (60 s)
    clock.now = t + 50 * S
    act.handle(_cmd("pause", "low", {"toward": "node-c", "lease_s": "60"}, ts_ns=clock.now))   # renewed
    clock.now = t + 59 * S
    assert act.expire_leases() == [] and shaper.low_share() == 0.0
    clock.now = t + 60 * S
    assert act.expire_leases() == ["node-b"] and shaper.low_share() == 0.0 and act.leases_expired == 1
    clock.now = t + 110 * S
    assert act.expire_leases() == ["node-c"] and shaper.low_share() == 1.0      # nothing held: the whole link back
    assert act.expire_leases() == []


def test_a_resume_ends_the_lease_and_a_failed_lift_is_tried_again(tmp_path: Path) -> None:
    class Failing(SimulatedShaper):
        fail = True

        def resume(self, holder: str) -> str:
            if self.fail:
                raise RuntimeError("netlink busy")
            return super().resume(holder)

    shaper, clock = Failing(), Clock()
    act = _actuator(tmp_path, shaper, clock)
    t = clock.now
    act.handle(_cmd("rate_limit", "low", {"share": "0.5", "toward": "node-b", "lease_s": "5"}, ts_ns=t))
    clock.now = t + 5 * S
    assert act.expire_leases() == [] and shaper.low_share() == 0.5             # failed: logged, not raised
    shaper.fail = False
    clock.now = t + 14 * S
    assert act.expire_leases() == []                                             # retried RETRY_NS later
    clock.now = t + 15 * S
    assert act.expire_leases() == ["node-b"] and shaper.low_share() == 1.0
    act.handle(_cmd("rate_limit", "low", {"share": "0.5", "toward": "node-b", "lease_s": "5"}, ts_ns=clock.now))
    act.handle(_cmd("resume", "low", {"toward": "node-b"}, ts_ns=clock.now + 1))
    clock.now += 10 * S
    assert act.expire_leases() == [] and act.leases.until == {}
    # a resume or a limit that fails in the kernel still leaves a lease behind, whose expiry lifts the limit
    act.handle(_cmd("rate_limit", "low", {"share": "0.5", "toward": "node-b", "lease_s": "5"}, ts_ns=clock.now))
    shaper.fail = True
    assert act.handle(_cmd("resume", "low", {"toward": "node-b"}, ts_ns=clock.now + 1)).status == "failed"
    shaper.fail = False
    clock.now += 5 * S
    assert act.expire_leases() == ["node-b"] and shaper.low_share() == 1.0

    class FailingLimit(SimulatedShaper):
        def limit(self, share: float, holder: str) -> str:
            super().limit(share, holder)   # the first link capped, the next one failing
            raise RuntimeError("tc failed on the second link")

    broken, clock = FailingLimit(), Clock()
    act = _actuator(tmp_path / "2", broken, clock)
    cmd = _cmd("rate_limit", "low", {"share": "0.5", "toward": "node-b", "lease_s": "5"}, ts_ns=clock.now)
    assert act.handle(cmd).status == "failed" and broken.low_share() == 0.5
    clock.now += 5 * S
    assert act.expire_leases() == ["node-b"] and broken.low_share() == 1.0


@pytest.mark.parametrize("target,params,why", [
    ("high", {"share": "0.5"}, "only the 'low' traffic class is shaped"),
    ("low", {"share": "2"}, "share 2.0 is not in (0, 1]"),
    ("low", {}, "is not a number"),
    ("low", {"share": "0.5", "lease_s": "0"}, "lease_s 0 is not in [1, 3600] s"),
    ("low", {"share": "0.5", "lease_s": "forever"}, "lease_s 'forever' is not a number"),
])
def test_bad_qos_commands_are_refused(tmp_path: Path, target: str, params: dict, why: str) -> None:
    shaper = SimulatedShaper()
    ack = _actuator(tmp_path, shaper).handle(_cmd("rate_limit", target, params, ts_ns=Clock().now))
    assert ack.status == "refused" and why in ack.detail and shaper.low_share() is None


def test_without_a_shaper_qos_is_refused_saying_how_to_configure_one(tmp_path: Path) -> None:
    ack = _actuator(tmp_path).handle(_cmd("pause", "low", {}, ts_ns=Clock().now))
    assert ack.status == "refused" and "CLOCKTOWER_ACTUATOR_QOS_LINKS" in ack.detail


def test_qos_links_setting() -> None:
    assert parse_qos_links("eth0=400000, eth1=200000") == {"eth0": 400000, "eth1": 200000}
    assert parse_qos_links('{"ib0": 100}') == {"ib0": 100}
    for bad in ("eth0", "eth0=fast", "eth0=0", '{"eth0": -1}'):
        with pytest.raises(ValueError):
            parse_qos_links(bad)
    assert ActuatorSettings(qos_links="eth0=1000").qos_links == {"eth0": 1000}


# -- the kernel: HTB in network namespaces ------------------------------------------------------------------------

_RUN = os.getpid() % 100_000   # names of this test run's own: two runs on one host must not remove each other's
A, B = f"ct-qos-a-{_RUN}", f"ct-qos-b-{_RUN}"
ADDR = {A: "10.79.0.1", B: "10.79.0.2"}
LINK = "qos0"
RATE_MBIT = 20
PROBE_PORT, BULK_PORT = 47001, 47002
BUDGET_MS = 2.0        # the probe's budget on this 20 Mbit/s link: a few packets' serialization (0.6 ms each)
BULK_STREAMS = 3


@contextlib.contextmanager
def two_hosts() -> Iterator[None]:
    """A and B on one 20 Mbit/s link with a deep queue (shaped on A's side)."""
    with shaped_paths(A, B, {LINK: "10.79.0"}, RATE_MBIT, tag=f"cq{_RUN}"):
        yield


def test_rate_limiting_the_low_class_brings_the_high_class_delay_back_within_budget(tmp_path: Path) -> None:
    with two_hosts():
        traffic = Traffic(A, B, ADDR[B], BULK_PORT, PROBE_PORT, BULK_STREAMS, probe_priority=HIGH_CLASSID)
        try:
            traffic.start()
            quiet = traffic.p50_after(time.monotonic() + 0.3, 1.0)
            traffic.bulk_on.set()
            t = time.monotonic() + 1.0
            congested = traffic.p50_after(t, 1.0)
            full_rate = traffic.bulk_mbit(t, 1.0)
            act = _actuator(tmp_path, KernelShaper({LINK: RATE_MBIT}, netns=A))
            ack = act.handle(_cmd("rate_limit", "low", {"share": "0.25", "toward": "b"}, ts_ns=Clock().now))
            assert ack.status == "applied" and "HTB installed" in ack.detail and "capped at 25%" in ack.detail, ack
            t = time.monotonic() + 0.5
            limited = traffic.p50_after(t, 1.0)
            limited_rate = traffic.bulk_mbit(t, 1.0)
            again = act.handle(_cmd("rate_limit", "low", {"share": "0.25", "toward": "b"}, ts_ns=Clock().now + 1))
            assert again.status == "applied" and "HTB installed" not in again.detail      # idempotent
            ack = act.handle(_cmd("resume", "low", {"toward": "b"}, ts_ns=Clock().now + 2))
            assert ack.status == "applied" and "shaping removed" in ack.detail, ack
            assert in_netns(A, lambda: _root_kind(LINK)) != "htb"
            # the link now has the kernel's default root qdisc (handle 0): a new limit takes it over
            ack = act.handle(_cmd("pause", "low", {"toward": "b"}, ts_ns=Clock().now + 3))
            assert ack.status == "applied" and "HTB installed" in ack.detail and "paused" in ack.detail, ack
            assert act.handle(_cmd("resume", "low", {"toward": "b"}, ts_ns=Clock().now + 4)).status == "applied"
        finally:
            traffic.close()
    print(f"probe p50 ms: quiet {quiet:.3f}, congested {congested:.2f}, limited {limited:.3f}; bulk Mbit/s: "
          f"{full_rate:.1f} -> {limited_rate:.1f}")
    assert quiet < 1.0, quiet
    assert congested > 2 * BUDGET_MS, (quiet, congested)
    assert limited < BUDGET_MS, (quiet, congested, limited)
    # the cap itself, not only HTB's priority: the low class gets about a quarter of the link
    assert full_rate > 0.7 * RATE_MBIT and 0.1 * RATE_MBIT < limited_rate < 0.4 * RATE_MBIT, (full_rate, limited_rate)


def _root_kind(link: str) -> str:
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        roots = [q for q in ipr.get_qdiscs(index=ipr.link_lookup(ifname=link)[0]) if q["parent"] == 0xFFFFFFFF]
        return roots[0].get_attr("TCA_KIND") if roots else ""


def test_a_cap_left_in_the_kernel_by_an_actuator_that_died_is_held_one_lease_then_lifted(tmp_path: Path) -> None:
    with two_hosts():
        act = _actuator(tmp_path / "first", KernelShaper({LINK: RATE_MBIT}, netns=A))
        assert act.leases.until == {}                                  # nothing of ours in place at start
        assert act.handle(_cmd("pause", "low", {"toward": "b"}, ts_ns=Clock().now)).status == "applied"
        clock = Clock()                                                # it dies holding the cap; a new one starts
        restarted = _actuator(tmp_path / "again", KernelShaper({LINK: RATE_MBIT}, netns=A), clock)
        assert list(restarted.leases.until) == [LEFTOVER]
        clock.now += 59 * S
        assert restarted.expire_leases() == [] and in_netns(A, lambda: _root_kind(LINK)) == "htb"
        clock.now += 1 * S
        assert restarted.expire_leases() == [LEFTOVER] and in_netns(A, lambda: _root_kind(LINK)) != "htb"
