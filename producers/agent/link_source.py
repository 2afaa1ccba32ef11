"""The node agent's network-link source: rtnetlink link events, no polling.

`LinkSource` (name "links") subscribes a NETLINK_ROUTE socket to the link multicast group (RTMGRP_LINK)
and watches it from a thread of its own:

- `start()` binds the socket first and then dumps every link on it (RTM_GETLINK), so no change can fall
  between the snapshot and the stream; each selected link is emitted once (the snapshot) before `start()`
  returns. Messages that arrive during the dump are applied after it.
- The thread then blocks in `select()` on the socket and a wake-up socketpair (no polling: the kernel pushes
  every change) and emits a LinkState for every RTM_NEWLINK that changes something relevant: admin up (IFF_UP), carrier,
  operstate or IFLA_CARRIER_CHANGES. RTM_NEWLINK messages that change nothing of that (MTU, alias,
  statistics, master, ...) are dropped. A deleted link is emitted once with up=False, carrier=False,
  operstate "deleted".
- `ts_ns` is `time.time_ns()` taken right after `recv()` returns the datagram, before it is parsed (pyroute2's
  parser costs ~0.25 ms per link message on the test VM, so stamping after it would add that, and more for
  later messages of a multi-message datagram). All messages of one datagram share its stamp.
- Every `report_interval_s` (1 s) the last known state of each link is re-sent from memory with a fresh
  ts_ns, the way the simulator reports: downstream detectors run on event time and need to see a port stay
  stable to resolve a flap incident.
- `stop()` sends one byte on the socketpair: the thread wakes at once, and the sockets are closed.
- If the socket's buffer overflows (ENOBUFS: an event storm, events were lost) the source dumps again and
  emits whatever differs from what it last emitted: the state stays right, and a lost flap still shows in
  `carrier_changes`. `resyncs` counts these. The buffer is 4 MiB (SO_RCVBUFFORCE as root).

pyroute2 is used for what it is good at here: creating the socket inside a named network namespace
(`pyroute2.netns.create_socket`) and parsing the messages (`MarshalRtnl`). Its `IPRoute`/`AsyncIPRoute`
event API (0.9: an asyncio loop per socket, `ipr.bind()` then `ipr.get()` per datagram) was tried first and
works, but it stamps only after parsing and hops through an asyncio queue, and stopping it from another
thread needs a call_soon_threadsafe cancel; the plain socket is simpler and more exact.

Field choices:

- `up` is operstate "up" (RFC 2863 / `ip link`'s "state UP": admin up *and* carrier *and* not dormant),
  or operstate "unknown" with admin up and carrier on, which is how drivers that do not report operstate
  (dummy, tun, some virtual NICs) look when they work. It is never True for an admin-down link.
- `operstate` is the kernel's name in lower case, as /sys/class/net/IF/operstate spells it ("up", "down",
  "lowerlayerdown", "dormant", "unknown", ...), plus "deleted" for a removed link.
- `carrier` is IFLA_CARRIER; `carrier_changes` is IFLA_CARRIER_CHANGES (cumulative since the device was
  created, counting both downs and ups, as the flap detector expects).
- `speed_mbps` is /sys/class/net/IF/speed while the link is up, where readable and positive, else 0. With
  `netns` set it is always 0: /sys/class/net shows the agent's own namespace, not that one.
- The kernel sends an intermediate message when a link is set admin up before its carrier comes up
  (operstate still "lowerlayerdown"/"down"); it is a real, distinct state and is emitted, so an admin up
  usually yields two events a fraction of a millisecond apart.

Timing caveat (kernel net/core/link_watch.c): carrier changes reach netlink through linkwatch, which runs
non-urgent events at most once a second. On a physical NIC a carrier loss is non-urgent (a carrier gain is
urgent, as are all changes of veths, VLANs and bond/team ports), so a loss within a second of the previous
linkwatch run can be reported, and stamped, up to ~1 s late. The veth test bed cannot show this.

`link` is always "" here (a netdev is its physical port's own name); `backup` is the port's backup from
`topology` (port_topology.TopologyCache: configured or seen in the routes; "" = none), re-read per batch.
`on_backup` and `quarantined` come from `actuator_view` (the agent's actuator, with --actuate; else null).

`interfaces=None` selects every link but loopback (IFF_LOOPBACK); otherwise exactly the named ones (by
current name, so a link renamed out of the selection is reported as deleted). `netns` watches inside a
named network namespace (/var/run/netns/NAME, as `ip netns add` makes; never created here): the tests use it.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import selectors
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyroute2 import netns as pr_netns
from pyroute2.netlink.rtnl.marshal import MarshalRtnl

from clocktower.producers.agent.port_topology import PortTopology
from clocktower.producers.agent.source import Availability, Emit
from clocktower.schemas.telemetry import LinkState

log = logging.getLogger(__name__)

IFF_UP = 0x1
IFF_LOOPBACK = 0x8
RTMGRP_LINK = 0x1
NETNS_RUN_DIR = Path("/var/run/netns")
SYSFS_NET = Path("/sys/class/net")
RTM_GETLINK = 18
NLM_F_REQUEST = 0x1
NLM_F_DUMP = 0x300
NLMSG_ERROR = 2
NLMSG_DONE = 3
SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)
RCVBUF = 4 << 20           # 4 MiB: room for an event storm (many links flapping at once) before ENOBUFS
RECV_SIZE = 1 << 16        # the kernel sends at most one page-ish skb per datagram; 64 KiB is ample
DUMP_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class _Seen:
    """What we last emitted for one link: the relevant part of its state (the dedupe key)."""

    ifname: str
    admin_up: bool
    carrier: bool
    operstate: str
    carrier_changes: int


def link_up(operstate: str, admin_up: bool, carrier: bool) -> bool:
    """The `up` field: operstate up, or operstate unknown with admin up and carrier (see module doc)."""
    if not admin_up:
        return False
    return operstate == "up" or (operstate == "unknown" and carrier)


def read_speed_mbps(ifname: str, sysfs_net: Path = SYSFS_NET) -> int:
    """/sys/class/net/IF/speed, or 0 where it is absent, unreadable (EINVAL while down) or not positive."""
    try:
        speed = int((sysfs_net / ifname / "speed").read_text().strip())
    except (OSError, ValueError):
        return 0
    return speed if 0 < speed < 2**32 else 0


class LinkSource:
    """Netlink-driven LinkState source ("links"); see the module doc."""

    name = "links"

    def __init__(self, node: str, interfaces: Sequence[str] | None = None, netns: str | None = None,
                 sysfs_net: Path = SYSFS_NET, report_interval_s: float | None = 1.0,
                 listeners: Sequence[Callable[[LinkState], None]] = (),
                 topology: Callable[[], PortTopology] | None = None,
                 actuator_view: Callable[[str], tuple[bool | None, bool | None]] | None = None) -> None:
        self.node = node
        self.topology = topology        # fills `backup` (a netdev's `link` is "": see port_topology.py)
        # Every link's last known state is re-sent this often (from memory, no netlink request): the
        # link-flap detector runs on event time, so it needs reports after the last change to see that a
        # port has been stable and resolve the incident. None or 0: changes only.
        self.report_interval_s = report_interval_s or None
        self.interfaces = frozenset(interfaces) if interfaces is not None else None
        self.netns = netns
        self.sysfs_net = sysfs_net
        self.counts: Counter[str] = Counter()
        self.resyncs = 0
        # Called on the source's thread with each LinkState before it is emitted (the agent's local
        # watchdog: a failover must not wait for the publisher). A listener's exception is logged and
        # counted (`listener_errors`), never stops the source or the emit.
        self.listeners = tuple(listeners)
        self.listener_errors = 0
        # (on_backup, quarantined) of a netdev as the agent's actuator knows it (clocktower agent --actuate),
        # stamped on every report, so the pipeline sees what the watchdog or an operator's release did.
        self.actuator_view = actuator_view
        self._topology = PortTopology()     # refreshed per batch from `topology` (never waits: TopologyCache)
        self._seen: dict[int, _Seen] = {}      # by ifindex; only touched on the source's thread
        self._emit: Emit | None = None
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        self._seq = 0
        self._marshal = MarshalRtnl()

    # -- Source protocol -------------------------------------------------------------------------

    def check(self) -> Availability:
        if self.netns is not None and not (NETNS_RUN_DIR / self.netns).exists():
            return Availability(False, f"network namespace {self.netns!r} does not exist "
                                       f"(no {NETNS_RUN_DIR / self.netns})")
        try:
            s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
        except (OSError, AttributeError) as e:
            return Availability(False, f"cannot open an rtnetlink socket: {e}")
        try:
            s.bind((0, RTMGRP_LINK))
        except OSError as e:
            return Availability(False, f"cannot subscribe to rtnetlink link events: {e}")
        finally:
            s.close()
        where = f"network namespace {self.netns!r}" if self.netns else "this host"
        which = ", ".join(sorted(self.interfaces)) if self.interfaces is not None else "all links but loopback"
        return Availability(True, f"rtnetlink link events on {where} ({which})")

    def start(self, emit: Emit) -> None:
        """Open and bind the socket, emit the snapshot, then watch on a thread; returns after the snapshot.

        Raises RuntimeError (with the reason) if the socket cannot be opened or the dump fails.
        """
        if self._thread is not None:
            raise RuntimeError("LinkSource already started")
        self._emit = emit
        try:
            self._sock = self._open_socket()
            self._wake_r, self._wake_w = socket.socketpair()
            if self.topology is not None:
                self._topology = self.topology()          # the first discovery, before the snapshot
            self._resync(initial=True)
        except Exception as e:
            self._close()
            raise RuntimeError(f"links: cannot watch rtnetlink{self._where()}: {e}") from e
        self._thread = threading.Thread(target=self._run, name=f"clocktower-links-{self.netns or 'host'}",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Wake the blocked read (a byte on a socketpair), join the thread, close the sockets."""
        thread = self._thread
        if thread is not None:
            with contextlib.suppress(OSError):
                assert self._wake_w is not None
                self._wake_w.send(b"x")
            thread.join(5.0)
            if thread.is_alive():
                log.warning("links: watcher thread did not stop within 5 s")
            self._thread = None
        self._close()

    # -- the socket and the watcher thread -------------------------------------------------------

    def _where(self) -> str:
        return f" in network namespace {self.netns!r}" if self.netns else ""

    def _open_socket(self) -> socket.socket:
        if self.netns is None:
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
        else:
            # pyroute2 creates it inside the namespace (in a helper process, ~0.1 s); flags=0: never create one
            sock = pr_netns.create_socket(self.netns, socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE,
                                          flags=0)
        try:
            try:
                sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, RCVBUF)
            except OSError:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)
            sock.bind((0, RTMGRP_LINK))                  # subscribe before the dump: nothing falls between
        except OSError:
            sock.close()
            raise
        return sock

    def _close(self) -> None:
        for name in ("_sock", "_wake_r", "_wake_w"):
            s = getattr(self, name)
            if s is not None:
                s.close()
                setattr(self, name, None)

    def _recv(self) -> tuple[int, bytes]:
        """One datagram from the netlink socket and the time it was read."""
        assert self._sock is not None
        data = self._sock.recv(RECV_SIZE)
        return time.time_ns(), data

    def _run(self) -> None:
        assert self._sock is not None and self._wake_r is not None
        with selectors.DefaultSelector() as sel:
            sel.register(self._sock, selectors.EVENT_READ, "netlink")
            sel.register(self._wake_r, selectors.EVENT_READ, "wake")
            period = self.report_interval_s
            next_report = time.monotonic() + period if period else None
            while True:
                timeout = None if next_report is None else max(0.0, next_report - time.monotonic())
                ready = [key.data for key, _ in sel.select(timeout)]   # blocks until a message or a report
                if "wake" in ready:
                    return
                if self.topology is not None:
                    with contextlib.suppress(Exception):          # TopologyCache: cached, never waits
                        self._topology = self.topology()
                if "netlink" not in ready and next_report is not None and time.monotonic() >= next_report:
                    # after a stall, one report and back on the period (no burst); a pending message goes first
                    next_report = max(next_report + period, time.monotonic())   # type: ignore[operator]
                    self._send([self._event(seen, time.time_ns()) for seen in self._seen.values()])
                if "netlink" not in ready:
                    continue
                try:
                    ts, data = self._recv()
                    self._send([ev for msg in self._marshal.parse(data) if (ev := self._on_message(msg, ts))])
                except OSError as e:
                    if e.errno != errno.ENOBUFS:
                        log.exception("links: netlink read failed; the source stops")
                        return
                    # The kernel dropped messages (our buffer overflowed): re-read every link.
                    self.resyncs += 1
                    log.warning("links: netlink buffer overflowed (ENOBUFS); resyncing from a dump")
                    if not self._resync_retrying():
                        return
                except Exception:
                    log.exception("links: could not handle a netlink message; skipped")

    def _resync_retrying(self, attempts: int = 3) -> bool:
        """Resync after an overflow; a dump can itself overflow under a storm, so try a few times."""
        for attempt in range(attempts):
            try:
                self._resync(initial=False)
                return True
            except OSError as e:
                if e.errno != errno.ENOBUFS or attempt == attempts - 1:
                    log.exception("links: resync failed; the source stops")
                    return False
                self.resyncs += 1
        return False

    def _dump(self) -> tuple[int, list[Any], list[tuple[int, Any]]]:
        """RTM_GETLINK dump on the bound socket: (dump time, link messages, events that came in between)."""
        assert self._sock is not None
        self._seq += 1
        seq = self._seq
        self._sock.send(struct.pack("=IHHII", 32, RTM_GETLINK, NLM_F_REQUEST | NLM_F_DUMP, seq, 0)
                        + struct.pack("=BxHiII", socket.AF_UNSPEC, 0, 0, 0, 0))
        ts_dump = time.time_ns()
        links: list[Any] = []
        interleaved: list[tuple[int, Any]] = []
        deadline = time.monotonic() + DUMP_TIMEOUT_S
        while True:
            self._sock.settimeout(max(0.0, deadline - time.monotonic()))
            try:
                ts, data = self._recv()
            finally:
                self._sock.settimeout(None)
            for msg in self._marshal.parse(data):
                header = msg["header"]
                if header["sequence_number"] != seq:
                    interleaved.append((ts, msg))
                elif header["type"] == NLMSG_DONE:
                    return ts_dump, links, interleaved
                elif header["type"] == NLMSG_ERROR or header.get("error") is not None:
                    raise OSError(f"RTM_GETLINK dump failed: {header.get('error') or msg}")
                else:
                    links.append(msg)

    def _resync(self, initial: bool) -> None:
        """A full dump: emit every selected link on the initial one, else only what changed or vanished."""
        ts_dump, links, interleaved = self._dump()
        out = []
        present = set()
        for msg in links:
            present.add(msg["index"])
            ev = self._on_message(msg, ts_dump, force=initial)
            if ev is not None:
                out.append(ev)
        for index in [i for i in self._seen if i not in present]:
            out.append(self._deleted(index, ts_dump))
        # Events that arrived during the dump go after it, through the same dedupe.
        out.extend(ev for ts, msg in interleaved if (ev := self._on_message(msg, ts)))
        self._send(out)

    # -- message handling (pure apart from the speed read) ---------------------------------------

    def _selected(self, ifname: str, flags: int) -> bool:
        if self.interfaces is None:
            return not flags & IFF_LOOPBACK
        return ifname in self.interfaces

    def _on_message(self, msg: Any, ts_ns: int, force: bool = False) -> LinkState | None:
        event = msg.get("event")
        index = msg.get("index")
        if event == "RTM_DELLINK":
            return self._deleted(index, ts_ns) if index in self._seen else None
        if event != "RTM_NEWLINK":
            return None
        ifname = msg.get("ifname")
        flags = msg.get("flags", 0)
        if not ifname or not self._selected(ifname, flags):
            if index in self._seen:                         # renamed out of the selection: gone for us
                return self._deleted(index, ts_ns)
            return None
        seen = _Seen(ifname=ifname, admin_up=bool(flags & IFF_UP), carrier=bool(msg.get("carrier", 0)),
                     operstate=str(msg.get("operstate") or "unknown").lower(),
                     carrier_changes=int(msg.get("carrier_changes") or 0))
        if not force and self._seen.get(index) == seen:
            return None
        self._seen[index] = seen
        return self._event(seen, ts_ns)

    def _event(self, seen: _Seen, ts_ns: int) -> LinkState:
        up = link_up(seen.operstate, seen.admin_up, seen.carrier)
        speed = read_speed_mbps(seen.ifname, self.sysfs_net) if self.netns is None and up else 0
        return LinkState(node=self.node, ts_ns=ts_ns, interface=seen.ifname, kind="ethernet", up=up,
                         backup=self._topology.backup_of(seen.ifname),
                         carrier_changes=seen.carrier_changes, speed_mbps=speed, operstate=seen.operstate,
                         carrier=seen.carrier, **self._view(seen.ifname))

    def _deleted(self, index: int, ts_ns: int) -> LinkState:
        seen = self._seen.pop(index)
        return LinkState(node=self.node, ts_ns=ts_ns, interface=seen.ifname, kind="ethernet", up=False,
                         backup=self._topology.backup_of(seen.ifname),
                         carrier_changes=seen.carrier_changes, speed_mbps=0, operstate="deleted", carrier=False,
                         **self._view(seen.ifname))

    def _view(self, ifname: str) -> dict[str, bool | None]:
        """The actuator's view of `ifname` (both null without one, or if asking it fails: never stops a report)."""
        if self.actuator_view is None:
            return {}
        try:
            on_backup, quarantined = self.actuator_view(ifname)
        except Exception:  # noqa: BLE001 - a report without the view is still a report
            log.exception("reading the actuator's view of %s failed", ifname)
            return {}
        return {"on_backup": on_backup, "quarantined": quarantined}

    def _send(self, events: list[LinkState]) -> None:
        if not events or self._emit is None:
            return
        for listener in self.listeners:
            for event in events:
                try:
                    listener(event)
                except Exception:
                    self.listener_errors += 1
                    log.exception("links: listener %r failed on %s; ignored", listener, event.interface)
        try:
            self._emit(list(events))
        except Exception:
            log.exception("links: emit failed; %d event(s) dropped", len(events))
            return
        self.counts[LinkState.SCHEMA] += len(events)

