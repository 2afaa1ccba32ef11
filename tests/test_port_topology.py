"""Port topology: RDMA port -> netdev from (fake) sysfs, backups from configuration or the routes (in a real
network namespace), and both carried on the LinkState reports of the "links" and "ib" sources."""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
from pydantic import ValidationError

from clocktower.producers.agent.config import AgentSettings
from clocktower.producers.agent.factory import build_sources
from clocktower.producers.agent.ib_sysfs import IbPortSource
from clocktower.producers.agent.link_source import LinkSource
from clocktower.producers.agent.port_topology import (
    PortTopology,
    Route,
    TopologyCache,
    discover,
    rdma_links,
    read_routes,
    route_backups,
)
from clocktower.schemas.telemetry import LinkState
from tests.netns import new_namespace
from tests.test_agent_links import FULL, make_port

# -- fake sysfs -----------------------------------------------------------------------------------------


def add_netdev(root: Path, dev: str, netdev: str, dev_port: int | None = None, ifindex: int = 2,
               iflink: int | None = None) -> None:
    """DEV/device/net/NETDEV as the kernel shows it (dev_port, ifindex, iflink files)."""
    d = root / dev / "device" / "net" / netdev
    d.mkdir(parents=True)
    if dev_port is not None:
        (d / "dev_port").write_text(f"{dev_port}\n")
    (d / "ifindex").write_text(f"{ifindex}\n")
    (d / "iflink").write_text(f"{ifindex if iflink is None else iflink}\n")


def add_gid_ndevs(port_dir: Path, names: dict[int, str | None]) -> None:
    """gid_attrs/ndevs/I; None is an unused GID, whose read fails (EINVAL in the kernel; a directory here)."""
    ndevs = port_dir / "gid_attrs" / "ndevs"
    ndevs.mkdir(parents=True)
    for i, name in names.items():
        if name is None:
            (ndevs / str(i)).mkdir()
        else:
            (ndevs / str(i)).write_text(f"{name}\n")


def test_roce_port_netdev_from_gid_attrs(tmp_path: Path) -> None:
    p = make_port(tmp_path, "mlx5_0", 1, link_layer="Ethernet")
    add_gid_ndevs(p, {0: None, 1: "eth0", 2: "eth0.100", 10: "vlan9"})   # lowest readable index wins
    add_netdev(tmp_path, "mlx5_0", "wrong0", dev_port=0)                 # gid_attrs come first
    assert rdma_links(tmp_path) == {"mlx5_0/1": "eth0"}


def test_single_port_netdev_from_device_net(tmp_path: Path) -> None:
    make_port(tmp_path, "mlx5_0", 1, link_layer="Ethernet")
    add_netdev(tmp_path, "mlx5_0", "enp1s0f0")                             # no dev_port file: port 1
    assert rdma_links(tmp_path) == {"mlx5_0/1": "enp1s0f0"}


def test_dual_port_device_maps_by_dev_port(tmp_path: Path) -> None:
    for n in (1, 2):
        make_port(tmp_path, "mlx4_0", n, link_layer="Ethernet")
    add_netdev(tmp_path, "mlx4_0", "eth7", dev_port=1, ifindex=8)
    add_netdev(tmp_path, "mlx4_0", "eth6", dev_port=0, ifindex=7)
    assert rdma_links(tmp_path) == {"mlx4_0/1": "eth6", "mlx4_0/2": "eth7"}


def test_pure_ib_port_has_no_link(tmp_path: Path) -> None:
    make_port(tmp_path, "mlx5_0", 1)
    (tmp_path / "mlx5_0" / "ports" / "1" / "gid_attrs" / "ndevs").mkdir(parents=True)   # IB: no ndev entries
    topo = PortTopology.build(rdma_links(tmp_path))
    assert topo.links == {} and topo.link_of("mlx5_0/1") == "" and topo.backup_of("mlx5_0/1") == ""


def test_ipoib_parent_chosen_over_child_and_ambiguity_gives_none(tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    make_port(tmp_path, "mlx5_0", 1)
    add_netdev(tmp_path, "mlx5_0", "ib0", dev_port=0, ifindex=5)
    add_netdev(tmp_path, "mlx5_0", "ib0.8001", dev_port=0, ifindex=9, iflink=5)   # a pkey child of ib0
    make_port(tmp_path, "mlx5_1", 1, link_layer="Ethernet")
    add_netdev(tmp_path, "mlx5_1", "eth0", dev_port=0, ifindex=3)
    add_netdev(tmp_path, "mlx5_1", "eth0_rep", dev_port=0, ifindex=4)              # two of their own: no guess
    with caplog.at_level(logging.WARNING, logger="clocktower.producers.agent.port_topology"):
        assert rdma_links(tmp_path) == {"mlx5_0/1": "ib0"}
    assert "mlx5_1/1 has several netdevs (eth0, eth0_rep)" in caplog.text


def test_missing_root_is_empty(tmp_path: Path) -> None:
    assert rdma_links(tmp_path / "absent") == {}


# -- merging and canonical names ------------------------------------------------------------------------

def test_backups_use_canonical_names_and_configuration_wins() -> None:
    links = {"mlx5_0/1": "eth0", "mlx5_1/1": "eth1"}
    topo = PortTopology.build(links, configured={"mlx5_0/1": "mlx5_1/1", "ib0": "ib1"},
                              routed={"eth0": "eth9", "eth2": "eth3"})
    assert dict(topo.backups) == {"eth0": "eth1", "ib0": "ib1", "eth2": "eth3"}
    assert topo.backup_of("mlx5_0/1") == topo.backup_of("eth0") == "eth1"
    assert topo.link_of("mlx5_0/1") == "eth0" and topo.link_of("eth0") == ""
    assert topo.backup_of("eth1") == "" and topo.backup_of("mlx5_1/1") == ""        # not symmetric
    assert topo.backup_of("eth3") == "" and topo.backup_of("nope") == ""


def test_a_port_configured_as_backup_of_its_own_netdev_is_dropped(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="clocktower.producers.agent.port_topology"):
        topo = PortTopology.build({"mlx5_0/1": "eth0"}, configured={"mlx5_0/1": "eth0"})
    assert topo.backups == {} and "own backup" in caplog.text


# -- route rules (pure) ---------------------------------------------------------------------------------

def test_route_backups_rules(caplog: pytest.LogCaptureFixture) -> None:
    routes = [
        Route("2:10.8.0.0/24", 20, (("x1", 1),)),
        Route("2:10.8.0.0/24", 10, (("x0", 1),)),                   # lower metric: primary, listed second
        Route("2:10.9.0.0/24", 0, (("y0", 1), ("y1", 4))),          # multipath: the heavier is primary
        Route("2:10.7.0.0/24", 0, (("z0", 1), ("z1", 1))),          # equal weights: the first
        Route("2:10.6.0.0/24", 0, (("solo", 1),)),                  # one device: no backup
        Route("2:10.5.0.0/24", 0, (("lo", 1), ("solo", 1))),        # lo is never a port
        Route("2:10.4.0.0/24", 5, (("w0", 1),)), Route("2:10.4.0.0/24", 6, (("w1", 1),)),
        Route("2:10.3.0.0/24", 5, (("w0", 1),)), Route("2:10.3.0.0/24", 6, (("w2", 1),)),   # w0: two backups
    ]
    with caplog.at_level(logging.WARNING, logger="clocktower.producers.agent.port_topology"):
        assert route_backups(routes) == {"x0": "x1", "y1": "y0", "z0": "z1"}
    assert "w0 several backups (w1, w2)" in caplog.text


# -- configuration --------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", ['{"eth0": "eth1", "mlx5_0/1": "mlx5_1/1"}', " eth0=eth1 , mlx5_0/1=mlx5_1/1,"])
def test_link_backups_from_env_both_formats(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("CLOCKTOWER_AGENT_LINK_BACKUPS", value)
    monkeypatch.setenv("CLOCKTOWER_AGENT_BACKUPS_FROM_ROUTES", "false")
    s = AgentSettings()
    assert s.link_backups == {"eth0": "eth1", "mlx5_0/1": "mlx5_1/1"} and s.backups_from_routes is False


def test_link_backups_defaults() -> None:
    s = AgentSettings()
    assert s.link_backups == {} and s.backups_from_routes is True and s.topology_refresh_s == 30.0
    assert AgentSettings(link_backups="").link_backups == {}


@pytest.mark.parametrize(("value", "why"), [
    ("eth0=eth0", "cannot be its own backup"),
    ({"ib0": "ib0"}, "cannot be its own backup"),
    ("eth0=", "is not a port name"),
    ("=eth1", "is not a port name"),
    ('{"": "eth1"}', "is not a port name"),
    ("eth0", "is not PRIMARY=BACKUP"),
    ("eth0=eth1,eth0=eth2", "names 'eth0' twice"),
    ('{"eth0": ', "not valid JSON"),
    ('{"eth0": 1}', "is not a port name"),
    ("eth0=eth 1", "is not a port name"),
    (["eth0", "eth1"], "must be a JSON object"),
])
def test_bad_link_backups_are_refused_clearly(value: object, why: str) -> None:
    with pytest.raises(ValidationError, match=why):
        AgentSettings(link_backups=value)


def test_bad_link_backups_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLOCKTOWER_AGENT_LINK_BACKUPS", "eth0=eth0")
    with pytest.raises(ValidationError, match="link_backups.*own backup"):
        AgentSettings()


# -- the cache ------------------------------------------------------------------------------------------

def _wait_for(cond, timeout: float = 3.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_cache_discovers_once_then_in_background_and_keeps_pairs_through_a_failover() -> None:
    answers = [PortTopology.build({}, routed={"eth0": "eth1"}),
               PortTopology.build({}, routed={"eth1": "eth0"}),      # a failover reversed the metrics
               PortTopology.build({}, routed={}),                   # or removed the primary's route
               PortTopology.build({}, routed={"eth0": "eth2"})]     # a new backup for eth0 wins
    gate = threading.Event()
    calls = []

    def discover_() -> PortTopology:
        calls.append(1)
        if len(calls) > 1:
            gate.wait(5)
        return answers[len(calls) - 1]

    cache = TopologyCache(discover_, refresh_s=0.05)
    assert dict(cache().backups) == {"eth0": "eth1"} and len(calls) == 1
    time.sleep(0.06)
    assert dict(cache().backups) == {"eth0": "eth1"}             # stale: refresh started, caller did not wait
    _wait_for(lambda: len(calls) == 2)
    gate.set()
    _wait_for(lambda: cache._at and not cache._refreshing and len(calls) == 2)
    assert dict(cache().backups) == {"eth0": "eth1"}             # the reversal does not flip the pair
    for n in (3, 4):
        time.sleep(0.06)
        cache()
        _wait_for(lambda n=n: len(calls) == n and not cache._refreshing)
    assert dict(cache().backups) == {"eth0": "eth2"}


def test_cache_keeps_the_last_topology_when_discovery_fails() -> None:
    state = {"fail": False}

    def discover_() -> PortTopology:
        if state["fail"]:
            raise OSError("netlink gone")
        return PortTopology.build({"mlx5_0/1": "eth0"})

    cache = TopologyCache(discover_, refresh_s=0.01)
    assert cache().link_of("mlx5_0/1") == "eth0"
    state["fail"] = True
    time.sleep(0.02)
    cache()
    _wait_for(lambda: not cache._refreshing)
    assert cache().link_of("mlx5_0/1") == "eth0"
    assert TopologyCache(discover_)().links == {}                 # failing from the start: an empty topology


def test_factory_gives_links_and_ib_one_topology(tmp_path: Path) -> None:
    make_port(tmp_path, "mlx5_0", 1, link_layer="Ethernet")
    add_netdev(tmp_path, "mlx5_0", "eth0")
    links, ib = build_sources(AgentSettings(sources=("links", "ib"), ib_sysfs_root=tmp_path,
                                            link_backups="eth0=eth1", backups_from_routes=False))
    assert isinstance(links, LinkSource) and isinstance(ib, IbPortSource)
    assert links.topology is ib.topology and links.topology is not None
    assert links.topology().backup_of("mlx5_0/1") == "eth1"


# -- the ib source --------------------------------------------------------------------------------------

def test_ib_reports_carry_link_and_backup(tmp_path: Path) -> None:
    for dev, netdev in (("mlx5_0", "eth0"), ("mlx5_1", "eth1")):
        add_gid_ndevs(make_port(tmp_path, dev, 1, link_layer="Ethernet", counters=FULL), {0: netdev})
    make_port(tmp_path, "mlx5_2", 1, counters=FULL)                       # pure IB, no netdev
    topology = TopologyCache(partial(discover, tmp_path, {"eth0": "eth1", "mlx5_2/1": "mlx5_3/1"}, False))
    src = IbPortSource("node-3", root=tmp_path, topology=topology)
    got = {e.interface: (e.link, e.backup) for e in src.poll(now=0.0)}
    assert got == {"mlx5_0/1": ("eth0", "eth1"), "mlx5_1/1": ("eth1", ""), "mlx5_2/1": ("", "mlx5_3/1")}
    shutil.rmtree(tmp_path / "mlx5_0")                                   # a vanished port keeps its names
    gone = [e for e in src.poll(now=0.5) if e.operstate == "deleted"]
    assert [(e.interface, e.link, e.backup) for e in gone] == [("mlx5_0/1", "eth0", "eth1")]


def test_ib_without_topology_reports_empty_fields(tmp_path: Path) -> None:
    add_gid_ndevs(make_port(tmp_path, "mlx5_0", 1, link_layer="Ethernet", counters=FULL), {0: "eth0"})
    (ev,) = IbPortSource("node-3", root=tmp_path).poll(now=0.0)
    assert (ev.link, ev.backup) == ("", "")


# -- routes in a real network namespace -----------------------------------------------------------------

@pytest.fixture
def routed_netns() -> Iterator[str]:
    """One namespace with four veth pairs: 10.8/24 via x0 (metric 10) and x1 (metric 20); 10.9/24 multipath over
    y0 (weight 1) and y1 (weight 4). Peer ends and IPv6 link-local routes are there too, and must not count."""
    from pyroute2 import IPRoute
    with new_namespace(f"cttopo{os.getpid() % 100000}") as ns:
        with IPRoute(netns=ns, flags=0) as ip:
            idx = {}
            for i, name in enumerate(("x0", "x1", "y0", "y1")):
                ip.link("add", ifname=name, kind="veth", peer=f"{name}p")
                for n in (name, f"{name}p"):
                    ip.link("set", index=ip.link_lookup(ifname=n)[0], state="up")
                idx[name] = ip.link_lookup(ifname=name)[0]
                ip.addr("add", index=idx[name], address=f"10.{i + 1}.0.1", prefixlen=24)
            ip.route("add", dst="10.8.0.0/24", gateway="10.2.0.2", oif=idx["x1"], priority=20)
            ip.route("add", dst="10.8.0.0/24", gateway="10.1.0.2", oif=idx["x0"], priority=10)
            ip.route("add", dst="10.9.0.0/24", multipath=[{"gateway": "10.3.0.2", "oif": idx["y0"], "hops": 0},
                                                          {"gateway": "10.4.0.2", "oif": idx["y1"], "hops": 3}])
        yield ns


def test_route_discovery_in_netns(routed_netns: str) -> None:
    routes = read_routes(routed_netns)
    assert any(len(r.nexthops) == 2 for r in routes)
    assert route_backups(routes) == {"x0": "x1", "y1": "y0"}
    topo = discover(Path("/nonexistent"), configured={"y1": "x1"}, netns=routed_netns)
    assert dict(topo.backups) == {"x0": "x1", "y1": "x1"}                      # configuration wins per primary
    assert discover(Path("/nonexistent"), from_routes=False, netns=routed_netns).backups == {}


def test_link_source_reports_backup_from_routes(routed_netns: str) -> None:
    got: list[LinkState] = []
    topology = TopologyCache(partial(discover, Path("/nonexistent"), {"x1": "y0"}, True, routed_netns))
    src = LinkSource("node-7", interfaces=["x0", "x1", "y0", "y1", "x0p"], netns=routed_netns,
                     report_interval_s=None, topology=topology)
    src.start(got.extend)
    try:
        snapshot = {e.interface: (e.link, e.backup) for e in got}
    finally:
        src.stop()
    assert snapshot == {"x0": ("", "x1"), "x1": ("", "y0"), "y0": ("", ""), "y1": ("", "y0"), "x0p": ("", "")}


def test_link_source_without_topology_reports_no_backup(routed_netns: str) -> None:
    got: list[LinkState] = []
    src = LinkSource("node-7", interfaces=["x0"], netns=routed_netns, report_interval_s=None)
    src.start(got.extend)
    src.stop()
    assert [(e.interface, e.link, e.backup) for e in got] == [("x0", "", "")]
