"""InfiniBand / RoCE port state and counters from sysfs, and the node agent's "ib" source that polls them.

Layout read (root defaults to /sys/class/infiniband; tests point it at a fake tree)::

    ROOT/DEV/ports/N/state          "4: ACTIVE"         -> ib_state "ACTIVE", up = ACTIVE
    ROOT/DEV/ports/N/phys_state     "5: LinkUp"         -> operstate "LinkUp", carrier = LinkUp
    ROOT/DEV/ports/N/rate           "100 Gb/sec (4X EDR)" -> speed_mbps 100000 (0 unless ACTIVE)
    ROOT/DEV/ports/N/link_layer     "InfiniBand" | "Ethernet" (RoCE); read, not reported (no schema field)
    ROOT/DEV/ports/N/counters/{port_xmit_data, port_rcv_data, port_xmit_packets, port_rcv_packets,
                               port_rcv_errors, port_xmit_discards, symbol_error, link_downed,
                               link_error_recovery}

Units: `port_xmit_data` and `port_rcv_data` are counted in 4-byte words by the IB spec (and by every
driver's sysfs file). They are reported in BYTES here (sysfs value x 4, wrapped to 64 bits), so they can be
added to and compared with every other byte counter in the pipeline. The other counters are packet/event
counts, reported as read (a 32-bit counter that saturated is reported as read). A counter file that is
missing, unreadable or unparsable is reported as null, never as 0: a 0 is a real reading (no errors), so a
counter that could not be read must not look like one. Older HCAs lack some counters; why each counter of each
port could not be read is logged once (at WARNING), not at every poll.

Each port is one LinkState with kind "infiniband" and interface "DEV/N" (e.g. "mlx5_0/1"), for RoCE ports
too (it is the RDMA port's view; the netdev over it is the LinkSource's). IB has no carrier-change count,
so `carrier_changes` is the port's `link_downed` counter (times the link went down, by the hardware): a
flap adds 1 here, where an Ethernet flap adds 2 (a down and an up). `carrier_changes` is shared with Ethernet
and cannot be null: while `link_downed` cannot be read it keeps the port's last value read (0 if none yet), so
an unreadable poll is not taken for a counter reset (which the flap detector would count as a flap).

`IbPortSource` (name "ib") is kept apart from the netlink `LinkSource` ("links") because it has a different
mechanism (sysfs has no change events, so it polls) and a different availability (most machines have no
RDMA device): the runner can then run and report each on its own. It reads every port every `interval_s`
(default 1 s) and emits, in one batch per poll:

- every port, once per `report_interval_s` (default 1 s, i.e. every poll): the counter time series;
- right away, at the poll that sees it, every port whose state (state, phys_state, rate) changed since the
  previous poll, or that appeared or vanished (a vanished port is reported once with up=False and operstate
  "deleted"). So with a longer report interval a state change still surfaces within one poll interval.

A state file (state, phys_state, rate) that reads empty or fails keeps the port's state of the poll before
(logged once) for up to KEEP_UNREAD_POLLS polls in a row: a failed read is not a down (see `keep_unread_state`). One
that fails longer is reported as read, "unknown" (not up): a port that cannot be read is not reported healthy.

`ts_ns` is time.time_ns() taken just before the port is read.

`link` is the port's netdev (RoCE `eth0`, IPoIB `ib0`) and `backup` its backup port, from `topology`
(port_topology.TopologyCache, read once per poll); a port with no netdev reports link "" (it is its own link).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from clocktower.producers.agent.port_topology import PortTopology
from clocktower.producers.agent.source import Availability, Emit
from clocktower.schemas.telemetry import LinkState

log = logging.getLogger(__name__)

IB_ROOT = Path("/sys/class/infiniband")
COUNTERS = ("port_xmit_data", "port_rcv_data", "port_xmit_packets", "port_rcv_packets", "port_rcv_errors",
            "port_xmit_discards", "symbol_error", "link_downed", "link_error_recovery")
WORD_COUNTERS = frozenset({"port_xmit_data", "port_rcv_data"})   # 4-byte words in sysfs; reported in bytes
U64 = 2**64 - 1
_RATE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([GM])b/sec", re.IGNORECASE)


def parse_enum(text: str) -> str:
    """"4: ACTIVE" -> "ACTIVE"; "5: LinkUp" -> "LinkUp"; a bare name is kept; empty -> "unknown"."""
    name = text.strip().split(":", 1)[-1].strip()
    return name or "unknown"


def parse_rate_mbps(text: str) -> int:
    """"100 Gb/sec (4X EDR)" -> 100000; "2.5 Gb/sec (1X SDR)" -> 2500; anything else -> 0."""
    m = _RATE.match(text)
    if not m:
        return 0
    value = float(m.group(1)) * (1000 if m.group(2).upper() == "G" else 1)
    return int(round(value))


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


_warned: set[Path] = set()     # counter files whose failure was logged: once per file, not every poll


def _read_counter(path: Path) -> int | None:
    """The counter's value, or None (logged once per file) if the file is missing, unreadable or not a count."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        why = "missing" if isinstance(e, FileNotFoundError) else f"unreadable ({e})"
        return _unread(path, why)
    try:
        value = int(text.strip(), 0)
    except ValueError:
        return _unread(path, f"not a count ({text.strip()[:40]!r})")
    return value if value >= 0 else _unread(path, f"negative ({value})")


def _unread(path: Path, why: str) -> None:
    if path not in _warned:
        _warned.add(path)
        log.warning("ib: counter %s %s: reported as null", path, why)
    return None


@dataclass(frozen=True)
class IbPort:
    """One RDMA port as read from sysfs. `counters` are in reporting units (data counters in bytes)."""

    device: str
    port: int
    state: str
    phys_state: str
    link_layer: str
    rate_mbps: int
    counters: dict[str, int | None] = field(default_factory=dict)     # None: could not be read
    unread: frozenset[str] = frozenset()     # the state files (state, phys_state, rate) that read empty or failed

    @property
    def name(self) -> str:
        return f"{self.device}/{self.port}"

    @property
    def up(self) -> bool:
        return self.state.upper() == "ACTIVE"

    @property
    def state_key(self) -> tuple[str, str, int]:
        """What a state change is: any of these differing between two polls."""
        return (self.state, self.phys_state, self.rate_mbps)

    def to_event(self, node: str, ts_ns: int, last_link_downed: int = 0, link: str = "", backup: str = "") -> LinkState:
        """The port's LinkState; an unread counter is None. `last_link_downed` is `carrier_changes` while
        `link_downed` is unread (see the module doc); `link`/`backup` come from the port topology."""
        c = self.counters
        downed = c.get("link_downed")
        return LinkState(node=node, ts_ns=ts_ns, interface=self.name, kind="infiniband", up=self.up,
                         carrier_changes=last_link_downed if downed is None else downed,
                         speed_mbps=self.rate_mbps if self.up else 0,
                         operstate=self.phys_state, carrier=self.phys_state.lower() == "linkup",
                         ib_state=self.state, link=link, backup=backup, **{k: c.get(k) for k in COUNTERS})


def _port_dirs(root: Path) -> list[tuple[str, int, Path]]:
    """(device, port number, port dir) for every DEV/ports/N under root, in order; [] if root is absent."""
    out = []
    try:
        devices = sorted(p for p in root.iterdir())
    except OSError:
        return []
    for dev in devices:
        try:
            ports = list((dev / "ports").iterdir())
        except OSError:
            continue
        for p in ports:
            if p.name.isdigit():
                out.append((dev.name, int(p.name), p))
    out.sort(key=lambda t: (t[0], t[1]))
    return out


def read_port(device: str, port: int, path: Path) -> IbPort:
    """Read one port directory, never raising. Missing state files read as "unknown", missing counters as None."""
    counters: dict[str, int | None] = {}
    for name in COUNTERS:
        value = _read_counter(path / "counters" / name)
        if value is not None:
            value = (value * 4) & U64 if name in WORD_COUNTERS else value & U64
        counters[name] = value
    texts = {name: (_read(path / name) or "").strip() for name in STATE_FILES}
    return IbPort(device=device, port=port, state=parse_enum(texts["state"]),
                  phys_state=parse_enum(texts["phys_state"]),
                  link_layer=(_read(path / "link_layer") or "unknown").strip() or "unknown",
                  rate_mbps=parse_rate_mbps(texts["rate"]), counters=counters,
                  unread=frozenset(name for name, text in texts.items() if not text))


STATE_FILES = {"state": "state", "phys_state": "phys_state", "rate": "rate_mbps"}   # file -> IbPort field
KEEP_UNREAD_POLLS = 3     # polls in a row a state file may fail and keep the state before; then it is "unknown"


def keep_unread_state(port: IbPort, before: IbPort | None) -> IbPort:
    """The port with each state file it could not read this poll taken from the poll before. Real sysfs never reads
    empty, but a driver reset can fail a read (EIO) for a moment: reported as read, that one poll would be a down
    and an up, which the flap detector counts and the watchdog may fail over on."""
    if before is None or not port.unread:
        return port
    _unread_state(port)
    return replace(port, **{STATE_FILES[name]: getattr(before, STATE_FILES[name]) for name in port.unread})


def _unread_state(port: IbPort) -> None:
    key = Path(port.name, *sorted(port.unread))
    if key not in _warned:
        _warned.add(key)
        log.warning("ib: %s could not read %s: kept the state of the poll before", port.name,
                    ", ".join(sorted(port.unread)))


def read_ports(root: Path = IB_ROOT) -> list[IbPort]:
    """Every port of every RDMA device under root, sorted by device then port."""
    return [read_port(dev, n, path) for dev, n, path in _port_dirs(root)]


class IbPortSource:
    """Polls InfiniBand/RoCE ports in sysfs ("ib"); see the module doc."""

    name = "ib"

    def __init__(self, node: str, root: Path | str = IB_ROOT, interval_s: float = 1.0,
                 report_interval_s: float | None = None,
                 topology: Callable[[], PortTopology] | None = None) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be > 0")
        self.node = node
        self.root = Path(root)
        self.interval_s = interval_s
        self.report_interval_s = interval_s if report_interval_s is None else report_interval_s
        self.topology = topology
        self.counts: Counter[str] = Counter()
        self.state_changes = 0
        self._last: dict[str, IbPort] = {}
        self._link_downed: dict[str, int] = {}     # last link_downed read per port: carrier_changes while unread
        self._unread_polls: dict[str, int] = {}    # polls in a row some state file of the port could not be read
        self._last_report: float | None = None     # monotonic time of the last full report
        self._emit: Emit | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def check(self) -> Availability:
        try:
            if not self.root.exists():
                return Availability(False, f"no {self.root}: no InfiniBand/RoCE device here "
                                           "(or the ib_core driver is not loaded)")
            if not self.root.is_dir():
                return Availability(False, f"{self.root} is not a directory")
            devices = sorted(p.name for p in self.root.iterdir())
            if not devices:
                return Availability(False, f"{self.root} lists no RDMA devices")
            ports = _port_dirs(self.root)
            if not ports:
                return Availability(False, f"RDMA device(s) {', '.join(devices)} under {self.root} have no ports")
            names = ", ".join(f"{d}/{n}" for d, n, _ in ports)
            return Availability(True, f"{len(ports)} RDMA port(s) polled every {self.interval_s:g} s: {names}")
        except OSError as e:
            return Availability(False, f"cannot read {self.root}: {e}")

    def poll(self, now: float | None = None) -> list[LinkState]:
        """Read every port once and return the events due (see the module doc). Does not emit.

        `now` is the monotonic time used for the report schedule (tests pass it; default time.monotonic()).
        """
        now = time.monotonic() if now is None else now
        full = self._last_report is None or now - self._last_report >= self.report_interval_s - 1e-9
        if full:
            self._last_report = now
        topo = self.topology() if self.topology is not None else PortTopology()
        out: list[LinkState] = []
        current: dict[str, IbPort] = {}
        for dev, n, path in _port_dirs(self.root):
            ts = time.time_ns()
            name = f"{dev}/{n}"
            before = self._last.get(name)
            port = read_port(dev, n, path)
            unread = self._unread_polls[name] = self._unread_polls.get(name, 0) + 1 if port.unread else 0
            if unread == KEEP_UNREAD_POLLS + 1:
                log.warning("ib: %s could not read %s for %d polls: reported as read (not up)", name,
                            ", ".join(sorted(port.unread)), unread)
            port = keep_unread_state(port, before if unread <= KEEP_UNREAD_POLLS else None)
            current[port.name] = port
            changed = before is None or before.state_key != port.state_key
            if changed and before is not None:
                self.state_changes += 1
            downed = port.counters.get("link_downed")
            if downed is not None:
                self._link_downed[port.name] = downed
            if full or changed:
                out.append(port.to_event(self.node, ts, self._link_downed.get(port.name, 0),
                                         topo.link_of(port.name), topo.backup_of(port.name)))
        for name, gone in self._last.items():
            if name not in current:
                self.state_changes += 1
                out.append(gone.to_event(self.node, time.time_ns(), self._link_downed.pop(name, 0),
                                         topo.link_of(name), topo.backup_of(name)).model_copy(
                    update={"up": False, "carrier": False, "speed_mbps": 0, "operstate": "deleted"}))
        self._last = current
        return out

    def start(self, emit: Emit) -> None:
        if self._thread is not None:
            raise RuntimeError("IbPortSource already started")
        self._emit = emit
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="clocktower-ib", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
            if self._thread.is_alive():
                log.warning("ib: poller thread did not stop within 5 s")
            self._thread = None

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            try:
                events = self.poll()
            except Exception:
                log.exception("ib: poll failed")
                events = []
            if events and self._emit is not None:
                try:
                    self._emit(events)
                    self.counts[LinkState.SCHEMA] += len(events)
                except Exception:
                    log.exception("ib: emit failed; %d event(s) dropped", len(events))
            next_at += self.interval_s
            delay = next_at - time.monotonic()
            if delay < 0:                          # fell behind (slow sysfs, suspended VM): skip, don't burst
                next_at = time.monotonic()
                delay = 0
            self._stop.wait(delay)
