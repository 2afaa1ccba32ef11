"""Which physical port each reported interface is, and which port backs up which: found, never guessed.

One physical port can be reported twice on a RoCE host: as its netdev (`eth0`, by the "links" source) and as its
RDMA port (`mlx5_0/1`, by the "ib" source). Every LinkState therefore names its physical `link`, and the
detectors key by `link or interface`, so one port is one link everywhere.

Conventions (what `PortTopology` answers):

- `link_of(interface)`: the netdev an RDMA port ("DEV/N") runs over, found in sysfs; "" for anything else. A
  netdev's own report carries link "" (it *is* the physical port's name), as does an RDMA port with no netdev
  (pure InfiniBand without IPoIB), so `link or interface` is always the port's one name. An IB port with an
  IPoIB netdev (`ib0`) gets that netdev: it is the same physical port.
- `backup_of(interface)`: the port that carries this one's traffic when it fails, "" when none is known. Both
  sides are canonical names (`link or interface`): a backup configured as `mlx5_0/1=mlx5_1/1` on a RoCE host
  reads `eth0 -> eth1`, and `backup_of("mlx5_0/1")` is then "eth1", like `backup_of("eth0")`. Backups are not
  symmetric: `eth0=eth1` gives eth1 no backup unless `eth1=eth0` is said too.

RDMA port -> netdev (sysfs, root is a parameter; tests use a fake tree), in this order:

1. RoCE: `ROOT/DEV/ports/N/gid_attrs/ndevs/I` names the netdev of GID I; the lowest readable index is taken
   (GID 0 is the port's default GID, from its own netdev; VLAN netdevs come at later indexes). Entries of
   unused GIDs fail to read (EINVAL) and are skipped.
2. Otherwise `ROOT/DEV/device/net/*` (the netdevs of the HCA's PCI function) whose `dev_port` (0-based; 0
   when unreadable) is N-1. If that leaves several, only those whose `ifindex` equals their `iflink` (a device
   of its own, not an IPoIB child like `ib0.8001`) are kept; if several still remain (e.g. switchdev
   representors) the port gets no link, and that is logged: never a guess.

sysfs shows only the netdevs of the agent's own network namespace, so a netdev moved into another namespace is
not found (the port then reports link "").

Backups: per-node configuration first (`link_backups`, per primary); for a primary with none configured,
"where the routes show it" (`backups_from_routes`): the main routing table (IPv4 and IPv6) is read with
pyroute2, and a destination reachable through two devices makes one the other's backup:

- two routes to the same destination with different metrics: the lower metric's device is the primary
  (equal metrics: the first in the kernel's dump order, the one the kernel uses);
- a multipath route with nexthops on two devices: the heaviest nexthop's device is the primary (equal
  weights: the first), the next device its backup.

Link-local destinations (fe80::/10, 169.254.0.0/16; IPv6 adds fe80::/64 on every interface) and multicast are
ignored, as are "lo" and routes of other tables. A primary that two destinations give different backups gets
none (logged). `TopologyCache` discovers at the first call (the source's start) and again every `refresh_s`
(default 30 s) after that, on a background thread so no caller waits: a route or netdev change shows within
that time. No netlink route subscription: routes change rarely, and the actuators' own failover route moves must
not change what the topology says (a failover makes the backup the lower metric, or removes the primary's route):
a rediscovery therefore keeps each primary's backup once seen until the routes give that primary another one,
so a pair that is really gone stays reported until the agent restarts.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

log = logging.getLogger(__name__)

IB_ROOT = Path("/sys/class/infiniband")
MAIN_TABLE = 254
RTN_UNICAST = 1
_LINK_LOCAL = (ipaddress.ip_network("fe80::/10"), ipaddress.ip_network("169.254.0.0/16"))


@dataclass(frozen=True)
class PortTopology:
    """RDMA port -> netdev (`links`) and primary -> backup (`backups`, canonical names); see the module doc."""

    links: Mapping[str, str] = field(default_factory=dict)
    backups: Mapping[str, str] = field(default_factory=dict)

    def link_of(self, interface: str) -> str:
        return self.links.get(interface, "")

    def backup_of(self, interface: str) -> str:
        return self.backups.get(self.link_of(interface) or interface, "")

    @classmethod
    def build(cls, links: Mapping[str, str], configured: Mapping[str, str] | None = None,
              routed: Mapping[str, str] | None = None) -> PortTopology:
        """Merge: configured backups win per primary; routed ones fill the rest. Names are made canonical."""
        def canon(name: str) -> str:
            return links.get(name, "") or name

        backups: dict[str, str] = {}
        for source, pairs in (("routes", routed or {}), ("configuration", configured or {})):
            for primary, backup in pairs.items():
                p, b = canon(primary), canon(backup)
                if p == b:
                    log.warning("topology: %s gives %s as its own backup (%s=%s); ignored", source, p, primary,
                                backup)
                    continue
                backups[p] = b
        return cls(MappingProxyType(dict(links)), MappingProxyType(backups))


# -- RDMA port -> netdev (sysfs) ----------------------------------------------------------------------------

def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _int(path: Path) -> int | None:
    text = _read(path)
    try:
        return int(text, 0) if text else None
    except ValueError:
        return None


def _roce_netdev(port_dir: Path) -> str:
    """The netdev of the port's lowest readable GID (`gid_attrs/ndevs/I`), or ""."""
    try:
        entries = sorted((int(p.name), p) for p in (port_dir / "gid_attrs" / "ndevs").iterdir() if p.name.isdigit())
    except OSError:
        return ""
    for _, path in entries:
        name = _read(path)
        if name:
            return name
    return ""


def _own_device(netdev: Path) -> bool:
    """A netdev of its own (ifindex == iflink), not a child of another (IPoIB `ib0.8001`, macvlan)."""
    index = _int(netdev / "ifindex")
    return index is not None and index == _int(netdev / "iflink")


def _pci_netdev(dev_dir: Path, port: int) -> str:
    """The netdev under `DEV/device/net` for 1-based `port` by `dev_port`, or "" (none, or ambiguous)."""
    try:
        netdevs = sorted(p for p in (dev_dir / "device" / "net").iterdir())
    except OSError:
        return ""
    matching = [p for p in netdevs if (_int(p / "dev_port") or 0) + 1 == port]
    if len(matching) > 1:
        matching = [p for p in matching if _own_device(p)]
    if len(matching) == 1:
        return matching[0].name
    if matching:
        log.warning("topology: %s/%d has several netdevs (%s); no link reported for it", dev_dir.name, port,
                    ", ".join(p.name for p in matching))
    return ""


def rdma_links(root: Path = IB_ROOT) -> dict[str, str]:
    """{"DEV/N": netdev} for every RDMA port under root that has a netdev (see the module doc)."""
    out: dict[str, str] = {}
    try:
        devices = sorted(root.iterdir())
    except OSError:
        return out
    for dev in devices:
        try:
            ports = sorted(int(p.name) for p in (dev / "ports").iterdir() if p.name.isdigit())
        except OSError:
            continue
        for n in ports:
            netdev = _roce_netdev(dev / "ports" / str(n)) or _pci_netdev(dev, n)
            if netdev:
                out[f"{dev.name}/{n}"] = netdev
    return out


# -- backups from the routing table -------------------------------------------------------------------------

@dataclass(frozen=True)
class Route:
    """One route of the main table: destination key, metric, and (device, weight) nexthops in kernel order."""

    dst: str
    metric: int
    nexthops: tuple[tuple[str, int], ...]


def route_backups(routes: Iterable[Route]) -> dict[str, str]:
    """{primary: backup} from destinations reachable through two devices (see the module doc). Pure."""
    by_dst: dict[str, list[tuple[int, int, int, str]]] = {}
    order = 0
    for r in routes:
        for dev, weight in r.nexthops:
            if dev and dev != "lo":
                by_dst.setdefault(r.dst, []).append((r.metric, -weight, order, dev))
                order += 1
    found: dict[str, set[str]] = {}
    for candidates in by_dst.values():
        devices = list(dict.fromkeys(dev for *_, dev in sorted(candidates)))
        if len(devices) >= 2:
            found.setdefault(devices[0], set()).add(devices[1])
    out = {}
    for primary, backups in found.items():
        if len(backups) == 1:
            out[primary] = next(iter(backups))
        else:
            log.warning("topology: routes give %s several backups (%s); none reported", primary,
                        ", ".join(sorted(backups)))
    return out


def _ignored(dst: str | None, dst_len: int) -> bool:
    if not dst:
        return False
    try:
        net = ipaddress.ip_network(f"{dst}/{dst_len}", strict=False)
    except ValueError:
        return True
    return net.is_multicast or any(net.version == ll.version and net.subnet_of(ll) for ll in _LINK_LOCAL)  # type: ignore[arg-type]


def read_routes(netns: str | None = None) -> list[Route]:
    """The main table's unicast routes (IPv4 and IPv6), via pyroute2, optionally inside a named namespace."""
    from pyroute2 import IPRoute

    with IPRoute(netns=netns, flags=0) if netns else IPRoute() as ip:
        names = {link["index"]: link.get("ifname") for link in ip.get_links()}
        out = []
        for msg in ip.route("dump"):
            if msg.get("table") != MAIN_TABLE or msg.get("type") != RTN_UNICAST:
                continue
            dst, dst_len = msg.get("dst"), int(msg.get("dst_len") or 0)
            if _ignored(dst, dst_len):
                continue
            hops = msg.get("multipath") or []
            if hops:
                nexthops = tuple((names.get(h.get("oif"), ""), int(h.get("hops") or 0) + 1) for h in hops)
            else:
                nexthops = ((names.get(msg.get("oif"), ""), 1),)
            out.append(Route(f"{msg.get('family')}:{dst or 'default'}/{dst_len}", int(msg.get("priority") or 0),
                             nexthops))
        return out


def discover(ib_root: Path = IB_ROOT, configured: Mapping[str, str] | None = None, from_routes: bool = True,
             netns: str | None = None) -> PortTopology:
    """Read sysfs and (unless `from_routes` is False) the routes, and merge with the configured backups."""
    routed: dict[str, str] = {}
    if from_routes:
        try:
            routed = route_backups(read_routes(netns))
        except Exception as e:  # noqa: BLE001 - no routes is no backups, never a stopped source
            log.warning("topology: cannot read the routing table (%s); backups from configuration only", e)
    return PortTopology.build(rdma_links(ib_root), configured, routed)


class TopologyCache:
    """The current PortTopology: discovered at the first call, then again every `refresh_s` in the background.

    Calling it never waits after the first call. A backup seen once is kept unless a rediscovery gives its primary
    another one: a failover moves the primary's routes (reversing the metrics, or removing them), and the pair
    must not vanish or flip while it is in force. A failed rediscovery keeps the last topology.
    """

    def __init__(self, discover: Callable[[], PortTopology], refresh_s: float = 30.0) -> None:
        self._discover = discover
        self.refresh_s = refresh_s
        self._lock = threading.Lock()
        self._current: PortTopology | None = None
        self._at = 0.0
        self._refreshing = False

    def __call__(self) -> PortTopology:
        with self._lock:
            current, stale = self._current, time.monotonic() - self._at >= self.refresh_s
            if current is None:
                self._set(self._discover_safely(None))
                return self._current  # type: ignore[return-value]
            if stale and self.refresh_s > 0 and not self._refreshing:
                self._refreshing = True
                threading.Thread(target=self._refresh, name="clocktower-topology", daemon=True).start()
        return current

    def _refresh(self) -> None:
        try:
            new = self._discover_safely(self._current)
            with self._lock:
                self._set(new)
        finally:
            self._refreshing = False

    def _set(self, new: PortTopology) -> None:
        self._current = new
        self._at = time.monotonic()

    def _discover_safely(self, previous: PortTopology | None) -> PortTopology:
        try:
            new = self._discover()
        except Exception:
            log.exception("topology: discovery failed; keeping the last one")
            return previous or PortTopology()
        if previous is None:
            return new
        backups = dict(new.backups)
        for p, b in previous.backups.items():
            if p in backups:                       # the routes say something for p now: that wins
                continue
            if backups.get(b) == p and previous.backups.get(b) != p:
                del backups[b]                     # reversed by a failover (the backup now has the lower metric)
            backups[p] = b                         # a pair once seen is kept (a failover may remove p's route)
        return PortTopology(new.links, MappingProxyType(backups))
