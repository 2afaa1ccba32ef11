"""KernelRouting in the failover bed: routes move to the backup and back, idempotently, through admin-downs
and a restart of the agent (the state file)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from clocktower.actuators.link_routing import LinkRouting, RoutingError
from clocktower.actuators.route_table import MOVED_PROTO, KernelRouting
from tests.failover_bed import ADDR, BACKUP, PRIMARY, SERVICE, failover_bed


def proto_of_route_to_peer(bed, host: str) -> int:
    for msg in bed.ip(host).route("dump", family=2):
        if msg.get("dst") == SERVICE["b" if host == "a" else "a"]:
            return int(msg["proto"])
    return -1


def test_fail_over_and_restore_move_the_routes(tmp_path: Path) -> None:
    with failover_bed("rtm") as bed, bed.routing("a", tmp_path / "a.json") as routing:
        assert isinstance(routing, LinkRouting)
        assert bed.route_to_peer("a") == (PRIMARY, ADDR["b", PRIMARY])
        assert not routing.on_backup(PRIMARY)
        assert routing.restore(PRIMARY, BACKUP).startswith("already on pri")

        assert routing.fail_over(PRIMARY, BACKUP) == f"moved 1 route(s) of pri to bkp (via {ADDR['b', BACKUP]})"
        assert bed.route_to_peer("a") == (BACKUP, ADDR["b", BACKUP])
        assert proto_of_route_to_peer(bed, "a") == MOVED_PROTO
        assert routing.on_backup(PRIMARY)
        assert routing.fail_over(PRIMARY, BACKUP) == "already on bkp"
        assert bed.route_to_peer("a") == (BACKUP, ADDR["b", BACKUP])

        assert routing.restore(PRIMARY, BACKUP) == "restored 1 route(s) of pri from bkp"
        assert bed.route_to_peer("a") == (PRIMARY, ADDR["b", PRIMARY])
        assert proto_of_route_to_peer(bed, "a") == 4          # static, as it was
        assert not routing.on_backup(PRIMARY)
        assert routing.restore(PRIMARY, BACKUP) == "already on pri"


def test_device_routes_without_a_backup_gateway(tmp_path: Path) -> None:
    with failover_bed("rtd") as bed, KernelRouting(tmp_path / "a.json", netns=bed.ns["a"]) as routing:
        assert "as device routes" in routing.fail_over(PRIMARY, BACKUP)
        assert bed.route_to_peer("a") == (BACKUP, None)
        routing.restore(PRIMARY, BACKUP)
        assert bed.route_to_peer("a") == (PRIMARY, ADDR["b", PRIMARY])


def test_restore_re_adds_routes_an_admin_down_deleted(tmp_path: Path) -> None:
    with failover_bed("rta") as bed, bed.routing("a", tmp_path / "a.json") as routing:
        routing.remember(PRIMARY, BACKUP)
        bed.set_admin("a", PRIMARY, False)                   # the kernel deletes the route, silently
        assert bed.route_to_peer("a") == ("", None)
        assert "moved 1 route(s)" in routing.fail_over(PRIMARY, BACKUP)   # from what was remembered
        assert bed.route_to_peer("a") == (BACKUP, ADDR["b", BACKUP])
        with pytest.raises(RoutingError, match="pri is admin down: its routes stay on bkp"):
            routing.restore(PRIMARY, BACKUP)
        assert bed.route_to_peer("a") == (BACKUP, ADDR["b", BACKUP])     # unchanged by the refusal
        bed.set_admin("a", PRIMARY, True)
        bed.wait_carrier("a", PRIMARY, True)
        assert routing.restore(PRIMARY, BACKUP) == "restored 1 route(s) of pri from bkp"
        assert bed.route_to_peer("a") == (PRIMARY, ADDR["b", PRIMARY])

        # failed over, then the primary bounces admin down and up: the restore still brings the route back
        routing.fail_over(PRIMARY, BACKUP)
        bed.set_admin("a", PRIMARY, False)
        bed.set_admin("a", PRIMARY, True)
        bed.wait_carrier("a", PRIMARY, True)
        assert routing.restore(PRIMARY, BACKUP) == "restored 1 route(s) of pri from bkp"
        assert bed.route_to_peer("a") == (PRIMARY, ADDR["b", PRIMARY])


def test_restore_refuses_a_link_without_carrier(tmp_path: Path) -> None:
    with failover_bed("rtc") as bed, bed.routing("a", tmp_path / "a.json") as routing:
        routing.fail_over(PRIMARY, BACKUP)
        bed.carrier_down("a")
        bed.wait_carrier("a", PRIMARY, False)
        with pytest.raises(RoutingError, match="pri is without carrier"):
            routing.restore(PRIMARY, BACKUP)


def test_state_file_lets_a_new_backend_restore(tmp_path: Path) -> None:
    state = tmp_path / "state" / "routing.json"
    with failover_bed("rts") as bed:
        with bed.routing("a", state) as first:
            first.fail_over(PRIMARY, BACKUP)
        raw = json.loads(state.read_text())
        assert raw["links"][PRIMARY]["on_backup"] is True
        assert raw["links"][PRIMARY]["routes"][0]["gateway"] == ADDR["b", PRIMARY]
        assert not list(state.parent.glob(".*tmp"))           # the temporary file was renamed over it
        bed.set_admin("a", PRIMARY, False)                    # and the kernel lost nothing we need
        bed.set_admin("a", PRIMARY, True)
        bed.wait_carrier("a", PRIMARY, True)
        with bed.routing("a", state) as second:               # the agent restarted
            assert second.on_backup(PRIMARY)
            assert second.restore(PRIMARY, BACKUP) == "restored 1 route(s) of pri from bkp"
        assert bed.route_to_peer("a") == (PRIMARY, ADDR["b", PRIMARY])
        assert json.loads(state.read_text())["links"][PRIMARY]["on_backup"] is False


def test_malformed_state_file_is_ignored_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    state = tmp_path / "routing.json"
    state.write_text(json.dumps({"version": 1, "links": {"pri": {"backup": "bkp", "on_backup": True,
                                                                   "routes": [{"dst": 5}]}}}))
    state.chmod(0o600)
    with failover_bed("rtf") as bed, bed.routing("a", state) as routing:
        assert not routing.on_backup(PRIMARY)
        assert "malformed" in caplog.text


def test_unknown_interfaces_and_nothing_to_move_are_clear_errors(tmp_path: Path) -> None:
    with failover_bed("rtu") as bed, bed.routing("a", tmp_path / "a.json") as routing:
        ns = bed.ns["a"]
        with pytest.raises(RoutingError, match=f"no interface 'eth9' in network namespace '{ns}'"):
            routing.fail_over(PRIMARY, "eth9")
        with pytest.raises(RoutingError, match="no interface 'eth9'"):
            routing.fail_over("eth9", BACKUP)
        with pytest.raises(RoutingError, match="own backup"):
            routing.fail_over(PRIMARY, PRIMARY)
        assert bed.route_to_peer("a") == (PRIMARY, ADDR["b", PRIMARY])    # unchanged
        with pytest.raises(RoutingError, match="bkp carries no routes to move"):
            routing.fail_over(BACKUP, PRIMARY)


def metrics_of_route(bed, host: str, dst: str) -> tuple[str, dict[str, int]]:
    ipr = bed.ip(host)
    for msg in ipr.route("dump", family=2):
        if msg.get("dst") == dst:
            name = ipr.link("get", index=msg.get("oif"))[0].get("ifname")
            return name, dict((msg.get("metrics") or {"attrs": []})["attrs"])
    return "", {}


def test_moved_routes_keep_their_metrics(tmp_path: Path) -> None:
    with failover_bed("rtx") as bed, bed.routing("a", tmp_path / "a.json") as routing:
        bed.ip("a").route("add", dst="10.71.0.9", dst_len=32, gateway=ADDR["b", PRIMARY], proto=4,
                          metrics={"mtu": 1400, "rto_min": 5})
        assert "moved 2 route(s)" in routing.fail_over(PRIMARY, BACKUP)
        want = {"RTAX_MTU": 1400, "RTAX_RTO_MIN": 5}
        assert metrics_of_route(bed, "a", "10.71.0.9") == (BACKUP, want)
        routing.restore(PRIMARY, BACKUP)
        assert metrics_of_route(bed, "a", "10.71.0.9") == (PRIMARY, want)


def test_a_re_created_backup_port_is_looked_up_again(tmp_path: Path) -> None:
    with failover_bed("rti") as bed, bed.routing("a", tmp_path / "a.json") as routing:
        ipr = bed.ip("a")

        def add_spare() -> int:
            ipr.link("add", ifname="spare0", kind="veth", peer="spare1")
            for name in ("spare1", "spare0"):
                ipr.link("set", index=ipr.link_lookup(ifname=name)[0], state="up")
            return int(ipr.link_lookup(ifname="spare0")[0])

        first = add_spare()
        routing.remember(PRIMARY, "spare0")                  # caches spare0's index
        ipr.link("del", index=first)
        assert add_spare() != first                           # same name, a new index
        assert "moved 1 route(s) of pri to spare0" in routing.fail_over(PRIMARY, "spare0")
        assert bed.route_to_peer("a") == ("spare0", None)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file to another user")
def test_a_planted_state_file_is_refused(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 18: a routes file planted in the state dir made root install the routes it named."""
    first = tmp_path / "mine" / "routing.json"
    with failover_bed("rtp") as bed:
        with bed.routing("a", first) as routing:
            routing.fail_over(PRIMARY, BACKUP)            # a genuine state file, then given away as a planted one
        before = bed.route_to_peer("a")
        planted = tmp_path / "planted.json"
        planted.write_bytes(first.read_bytes())
        os.chown(planted, 65534, 65534)
        with bed.routing("a", planted) as routing:
            assert not routing.on_backup(PRIMARY), "the planted file was believed"
        assert "refused" in caplog.text and "belongs to uid 65534" in caplog.text
        assert bed.route_to_peer("a") == before   # nothing installed from it


def test_a_planted_symlink_at_the_temporary_file_is_not_written_through(tmp_path: Path) -> None:
    """Issue 18: a symlink planted at the state file's temporary name had root overwrite its target with JSON."""
    state = tmp_path / "state" / "routing.json"
    state.parent.mkdir()
    victim = tmp_path / "victim"
    victim.write_bytes(b"root's file\n")
    (state.parent / f".{state.name}.{os.getpid()}.tmp").symlink_to(victim)
    with failover_bed("rtl") as bed, bed.routing("a", state) as routing:
        routing.fail_over(PRIMARY, BACKUP)
        assert json.loads(state.read_text())["links"][PRIMARY]["on_backup"] is True
        routing.restore(PRIMARY, BACKUP)
    assert victim.read_bytes() == b"root's file\n"
    assert (state.stat().st_mode & 0o777) == 0o600
