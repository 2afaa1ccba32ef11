"""LinkRouting on the kernel's routing tables (pyroute2), optionally inside a named network namespace.

A link's routes are its static IPv4 unicast routes: every table but `local`, output interface the link,
any protocol but `kernel` (the connected-subnet routes the kernel manages itself) and `MOVED_PROTO`.

- **fail_over** replaces each route with the same key (table, destination, TOS, metric) pointing at the
  backup port, marked `proto MOVED_PROTO` (171: `ip route show proto 171` lists what clocktower moved). A
  replace is one atomic change per route: traffic never sees a missing route. A route via a gateway goes via
  the backup's gateway from `gateways` (backup port -> address) where one is configured, else it becomes a
  device route on the backup: that works where the far end answers ARP for the destination on that port
  (Linux does by default, arp_ignore=0) or the port is point-to-point. Other routes are unchanged.
- **restore** puts the remembered routes back as they were (same gateway, protocol, source, metric). It
  refuses while the link is admin down or has no carrier: the routes would go onto a dead port. It first
  deletes the gateways' unresolved neighbour entries (INCOMPLETE/FAILED, left by packets sent during the
  outage), which would otherwise hold traffic for up to the 1 s ARP retransmit timer.
- Setting a link admin down silently deletes its routes (no RTM_DELROUTE), so the routes are remembered
  before they are needed: `remember(link, backup)` (the watchdog calls it when it sees the link up) and every
  fail_over record them, in memory and in the JSON file `state_path` (written atomically: tmp, fsync,
  rename), so a failover after an admin-down, and a restore by a restarted agent, still know them.

A moved route keeps its metrics (mtu, advmss, rto_min, initcwnd, ...): a jumbo-frame route stays jumbo.

Limits: IPv4 only; multipath routes (RTA_MULTIPATH) and policy rules are not moved; the congestion-control
metric (RTAX_CC_ALGO, a string) is not copied; a route added to the link while it is failed over is
not known until the next remember after the restore.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import socket
import stat
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl.rtmsg import rtmsg

from clocktower.actuators.link_routing import RoutingError
from clocktower.actuators.route_writer import RouteSpec, RouteWriter
from clocktower.runtime.errors import UserError
from clocktower.runtime.private_file import private_dir, read_checked_file, write_synced

log = logging.getLogger(__name__)

MOVED_PROTO = 171          # rtm_protocol of the routes clocktower moved onto a backup port
RTPROT_KERNEL = 2
RT_TABLE_LOCAL = 255
RTN_UNICAST = 1
RT_SCOPE_UNIVERSE = 0
RT_SCOPE_LINK = 253
IFF_UP = 0x1
NUD_INCOMPLETE, NUD_FAILED = 0x01, 0x20
STATE_VERSION = 1
# RTAX_* numbers of the u32 route metrics (the nla_map's position is the number); RTAX_CC_ALGO (a string) is
# not copied
_RTAX = {name: number for number, (name, kind) in enumerate(rtmsg.metrics.nla_map) if kind == "uint32"}


@dataclass(frozen=True)
class Route:
    """One remembered route, as the link carried it (what restore puts back)."""

    dst: str | None            # None: the default route
    dst_len: int
    table: int
    priority: int
    tos: int
    gateway: str | None
    prefsrc: str | None
    proto: int
    scope: int
    metrics: tuple[tuple[int, int], ...] = ()     # (RTAX_* number, value) of its u32 metrics (mtu, rto_min, ...)

    @property
    def key(self) -> tuple[int, str | None, int, int, int]:
        """The kernel's identity of an IPv4 route: a replace with the same key replaces it."""
        return (self.table, self.dst, self.dst_len, self.tos, self.priority)

    def text(self) -> str:
        return f"{self.dst or 'default'}/{self.dst_len}" + (f" via {self.gateway}" if self.gateway else "")

    @classmethod
    def parse(cls, raw: Any) -> Route:
        """From the state file; anything malformed raises (TypeError/ValueError/KeyError)."""
        if not isinstance(raw, dict):
            raise TypeError("a route must be an object")
        metrics = raw.get("metrics", [])
        if not isinstance(metrics, list) or not all(
                isinstance(m, list) and len(m) == 2 and all(isinstance(v, int) for v in m) for m in metrics):
            raise TypeError(f"route {raw!r}: metrics must be [[type, value], ...]")
        r = cls(**{**raw, "metrics": tuple((kind, value) for kind, value in metrics)})
        if not all(isinstance(v, int) for v in (r.dst_len, r.table, r.priority, r.tos, r.proto, r.scope)):
            raise TypeError(f"route {raw!r}: integer fields expected")
        if not all(v is None or isinstance(v, str) for v in (r.dst, r.gateway, r.prefsrc)):
            raise TypeError(f"route {raw!r}: address fields must be strings")
        return r


@dataclass(frozen=True)
class _LiveRoute:
    """A route in the kernel now, with its output interface."""

    route: Route
    oif: int


@dataclass
class _LinkRecord:
    backup: str
    on_backup: bool
    routes: list[Route]


def _route_of(msg: Any) -> Route:
    return Route(dst=msg.get("dst"), dst_len=int(msg["dst_len"]), table=int(msg.get("table") or msg["table"]),
                 priority=int(msg.get("priority") or 0), tos=int(msg["tos"]), gateway=msg.get("gateway"),
                 prefsrc=msg.get("prefsrc"), proto=int(msg["proto"]), scope=int(msg["scope"]),
                 metrics=_metrics_of(msg))


def _metrics_of(msg: Any) -> tuple[tuple[int, int], ...]:
    nested = msg.get("metrics")
    if not nested:
        return ()
    return tuple(sorted((_RTAX[name], int(value)) for name, value in nested["attrs"] if name in _RTAX))


def _merge(old: Iterable[Route], new: Iterable[Route]) -> list[Route]:
    """Remembered routes updated by what the link carries now (same key: the live one wins)."""
    by_key = {r.key: r for r in old}
    by_key.update((r.key, r) for r in new)
    return list(by_key.values())


class _StaleIndex(RoutingError):
    """A cached interface index is gone (the interface was re-created): look names up again and retry once."""


class KernelRouting:
    """LinkRouting on the kernel's tables; `netns` names a namespace (/var/run/netns/NAME), None = this one.

    Interface indexes are cached by name (a failover must not spend ~2 ms per lookup); a write that finds
    the index gone (ENODEV) looks the names up again and retries once. A link renamed under a cached name is
    not noticed until then.
    """

    def __init__(self, state_path: Path, netns: str | None = None, gateways: Mapping[str, str] | None = None) -> None:
        self.state_path = Path(state_path)
        self.netns = netns
        self.gateways = dict(gateways or {})
        self._lock = threading.Lock()
        self._links: dict[str, _LinkRecord] = self._load()
        self._indexes: dict[str, int] = {}
        try:
            self._ipr = IPRoute(netns=netns, flags=0) if netns else IPRoute()
            self._writer = RouteWriter(netns)
        except Exception as e:
            raise RoutingError(f"cannot open rtnetlink{self._where()}: {e}") from e

    def close(self) -> None:
        self._ipr.close()
        self._writer.close()

    def __enter__(self) -> KernelRouting:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- LinkRouting ---------------------------------------------------------------------------

    def remember(self, link: str, backup: str) -> str:
        with self._lock:
            index = self._index(link)
            self._index(backup)                 # cached now: the failover's fast path reads nothing
            rec = self._links.get(link)
            if rec is not None and rec.on_backup:
                return f"{link} is on {rec.backup}: kept {len(rec.routes)} remembered route(s)"
            live = self._live(index)
            if not live:
                known = len(rec.routes) if rec else 0
                return f"{link} carries no routes now: kept {known} remembered route(s)"
            if rec is None or set(rec.routes) != set(live):
                self._links[link] = _LinkRecord(backup=backup, on_backup=False, routes=live)
                return f"remembered {len(live)} route(s) of {link}{self._save()}"
            return f"remembered {len(live)} route(s) of {link}"

    def fail_over(self, link: str, backup: str) -> str:
        if link == backup:
            raise RoutingError(f"{link} cannot be its own backup")
        return self._once_more_if_stale(self._fail_over, link, backup)

    def _fail_over(self, link: str, backup: str) -> str:
        index, backup_index = self._index(link), self._index(backup)
        rec = self._links.get(link)
        gateway = self.gateways.get(backup)
        moved_first: list[Route] = []
        if rec is not None and rec.routes and not rec.on_backup:
            # the fast path: move what we know before reading anything (a dump costs ~1.5 ms)
            self._write([self._moved(r, gateway) for r in rec.routes], backup_index, f"move to {backup}")
            moved_first = rec.routes
        dump = self._dump()
        live = [lr.route for lr in dump if lr.oif == index and lr.route.proto not in (RTPROT_KERNEL, MOVED_PROTO)]
        routes = _merge(rec.routes if rec else [], live)
        if not routes:
            raise RoutingError(f"{link} carries no routes to move to {backup}, and none are remembered "
                               f"(an admin-down before the first remember deletes them)")
        on_backup = {lr.route.key for lr in dump if lr.route.proto == MOVED_PROTO and lr.oif == backup_index}
        todo = [r for r in routes if r.key not in on_backup]
        if todo:
            self._write([self._moved(r, gateway) for r in todo], backup_index, f"move to {backup}")
        if gateway:
            self._flush_unresolved(backup_index, {gateway})
        self._links[link] = _LinkRecord(backup=backup, on_backup=True, routes=routes)
        note = self._save()
        moved = len(moved_first) + len(todo)
        if not moved:
            return f"already on {backup}{note}"
        how = f"via {gateway}" if gateway else "as device routes"
        return f"moved {moved} route(s) of {link} to {backup} ({how}){note}"

    def restore(self, link: str, backup: str) -> str:
        return self._once_more_if_stale(self._restore, link, backup)

    def _once_more_if_stale(self, op: Callable[[str, str], str], link: str, backup: str) -> str:
        """`op` under the lock; again once with fresh interface indexes if a cached one was gone (a re-created
        port keeps its name but gets a new index)."""
        with self._lock:
            try:
                return op(link, backup)
            except _StaleIndex:
                self._indexes.clear()
                return op(link, backup)

    def _restore(self, link: str, backup: str) -> str:
        index = self._index(link)
        rec = self._links.get(link)
        if rec is None or not rec.routes:
            return f"already on {link} (no routes of {link} were moved)"
        present = {lr.route.key: lr.route for lr in self._dump() if lr.oif == index}
        todo = [r for r in rec.routes if present.get(r.key) != r]
        if todo:
            state = self._link_state(index)
            if state:
                raise RoutingError(f"{link} is {state}: its routes stay on {rec.backup or backup}")
            self._flush_unresolved(index, {r.gateway for r in todo if r.gateway})
            self._write(todo, index, f"restore onto {link}")
        self._links[link] = _LinkRecord(backup=rec.backup or backup, on_backup=False, routes=rec.routes)
        note = self._save()
        if not todo:
            return f"already on {link}{note}"
        return f"restored {len(todo)} route(s) of {link} from {rec.backup or backup}{note}"

    def on_backup(self, link: str) -> bool:
        # Without the lock: a failover holds it through its dump and fsynced save (5-25 ms), and the link source
        # reads this while building every report. A record is replaced whole, never changed in place.
        rec = self._links.get(link)
        return bool(rec and rec.on_backup)

    # -- kernel --------------------------------------------------------------------------------

    def _where(self) -> str:
        return f" in network namespace {self.netns!r}" if self.netns else ""

    def _index(self, name: str) -> int:
        if name in self._indexes:
            return self._indexes[name]
        if not name:
            raise RoutingError("no interface named (empty name)")
        try:
            index = int(self._ipr.link("get", ifname=name)[0]["index"])
        except NetlinkError as e:
            if e.code == errno.ENODEV:
                raise RoutingError(f"no interface {name!r}{self._where()}") from e
            raise RoutingError(f"cannot read interface {name!r}{self._where()}: {e}") from e
        self._indexes[name] = index
        return index

    def _link_state(self, index: int) -> str:
        """"" when the link can carry routes, else why not ("admin down", "without carrier")."""
        try:
            msg = self._ipr.link("get", index=index)[0]
        except NetlinkError as e:
            if e.code == errno.ENODEV:
                raise _StaleIndex(f"interface index {index} is gone") from e
            raise RoutingError(f"cannot read interface {index}{self._where()}: {e}") from e
        if not msg["flags"] & IFF_UP:
            return "admin down"
        if not msg.get("carrier"):
            return "without carrier"
        return ""

    def _dump(self) -> list[_LiveRoute]:
        try:
            msgs = list(self._ipr.route("dump", family=socket.AF_INET))
        except NetlinkError as e:
            raise RoutingError(f"cannot read the routes{self._where()}: {e}") from e
        out = []
        for msg in msgs:
            if msg["type"] != RTN_UNICAST or msg.get("table") == RT_TABLE_LOCAL or msg.get("oif") is None:
                continue
            out.append(_LiveRoute(route=_route_of(msg), oif=int(msg.get("oif"))))
        return out

    def _live(self, index: int) -> list[Route]:
        """The routes the link carries now (not the kernel's own, not ones moved onto it)."""
        return [lr.route for lr in self._dump()
                if lr.oif == index and lr.route.proto not in (RTPROT_KERNEL, MOVED_PROTO)]

    def _flush_unresolved(self, index: int, gateways: set[str]) -> None:
        """Delete the gateways' neighbour entries on `index` that are unresolved (INCOMPLETE or FAILED).

        Packets sent while the port had no carrier leave such an entry behind, and the kernel does not ask
        again when the carrier returns: it waits for its retransmit timer (1 s), and traffic waits with it
        (measured: ~0.9 s after a restore). Without the entry, the first packet asks at once.
        """
        if not gateways:
            return
        try:
            for msg in self._ipr.neigh("dump", ifindex=index, family=socket.AF_INET):
                if msg.get("dst") in gateways and msg["state"] & (NUD_INCOMPLETE | NUD_FAILED):
                    self._ipr.neigh("del", dst=msg.get("dst"), ifindex=index)
        except NetlinkError as e:
            log.warning("routing: cannot flush unresolved neighbours on interface %d: %s", index, e)

    @staticmethod
    def _moved(r: Route, gateway: str | None) -> Route:
        """`r` as it goes onto the backup: the backup's gateway (or a device route), marked MOVED_PROTO."""
        via = gateway if r.gateway else None
        return replace(r, gateway=via, proto=MOVED_PROTO, scope=RT_SCOPE_UNIVERSE if via else RT_SCOPE_LINK)

    def _write(self, routes: list[Route], oif: int, what: str) -> None:
        """Replace `routes` onto interface `oif`; RoutingError naming the first route the kernel refused."""
        specs = [RouteSpec(dst=r.dst, dst_len=r.dst_len, table=r.table, priority=r.priority, tos=r.tos,
                           proto=r.proto, scope=r.scope, oif=oif, gateway=r.gateway, prefsrc=r.prefsrc,
                           metrics=r.metrics)
                 for r in routes]
        try:
            codes = self._writer.replace(specs)
        except OSError as e:
            raise RoutingError(f"cannot {what}{self._where()}: {e}") from e
        for r, code in zip(routes, codes, strict=True):
            if code == errno.ENODEV:
                raise _StaleIndex(f"cannot {what}: interface index {oif} is gone")
            if code:
                raise RoutingError(f"cannot {what} {r.text()}{self._where()}: {os.strerror(code)}")

    # -- state file ----------------------------------------------------------------------------
    # A planted routes.json once made root install the routes it named, and a planted symlink at the temporary
    # file's name had root overwrite its target with JSON (issue 18): the file must be this user's and writable
    # by no one else, and the temporary file is created afresh (O_EXCL), never through a symlink (O_NOFOLLOW).

    def _load(self) -> dict[str, _LinkRecord]:
        if not self.state_path.exists() and not self.state_path.is_symlink():
            return {}
        try:   # refuses a symlink, another user's file or one others may write: it says which routes to install
            raw = json.loads(read_checked_file(self.state_path, _owned_and_not_shared))
        except UserError as e:
            log.warning("routing: state file %s refused (%s); starting without remembered routes", self.state_path, e)
            return {}
        except (OSError, ValueError) as e:
            log.warning("routing: state file %s unreadable (%s); starting without remembered routes",
                        self.state_path, e)
            return {}
        links: dict[str, _LinkRecord] = {}
        try:
            if raw.get("version") != STATE_VERSION:
                raise ValueError(f"version {raw.get('version')!r}, expected {STATE_VERSION}")
            for link, rec in raw["links"].items():
                if not isinstance(rec["backup"], str) or not isinstance(rec["on_backup"], bool):
                    raise TypeError(f"link {link!r}: backup must be a string and on_backup a boolean")
                links[str(link)] = _LinkRecord(rec["backup"], rec["on_backup"],
                                               [Route.parse(r) for r in rec["routes"]])
        except (AttributeError, KeyError, TypeError, ValueError) as e:
            log.warning("routing: state file %s malformed (%s); starting without remembered routes",
                        self.state_path, e)
            return {}
        return links

    def _save(self) -> str:
        """Write atomically (a crash leaves the old file or the new one); "" or a note that it failed.

        The routes are already moved when this runs: a failed write must not turn that into a failure,
        so it is logged and said in the result instead (the next successful write catches up).
        """
        data = {"version": STATE_VERSION, "links": {
            link: {"backup": rec.backup, "on_backup": rec.on_backup, "routes": [asdict(r) for r in rec.routes]}
            for link, rec in self._links.items()}}
        path = self.state_path
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            private_dir(path.parent)   # 0700, and not a symlink or another user's
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()           # a leftover of a crash (a planted symlink is removed, never followed)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                write_synced(fd, json.dumps(data, indent=1, sort_keys=True).encode())
            finally:
                os.close(fd)
            os.replace(tmp, path)
            fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except (OSError, UserError) as e:
            with contextlib.suppress(OSError):
                tmp.unlink()
            log.warning("routing: cannot write the state file %s: %s", path, e)
            return f" (state file not written: {e})"
        return ""


def _owned_and_not_shared(st: os.stat_result) -> None:
    """The state file must be this user's, and writable by no one else (read_checked_file's check)."""
    if st.st_uid != os.geteuid():
        raise UserError(f"it belongs to uid {st.st_uid}, not to this user")
    if st.st_mode & 0o022:
        raise UserError(f"others may write it (mode {stat.S_IMODE(st.st_mode):o})")
