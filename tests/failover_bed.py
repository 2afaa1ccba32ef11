"""A failover test bed: two hosts (network namespaces) joined by a primary and a backup veth pair.

    host a                                       host b
    lo  10.71.0.1/32                             lo  10.71.0.2/32
    pri 10.71.1.1/24  <==== primary veth ====>   pri 10.71.1.2/24
    bkp 10.71.2.1/24  <==== backup veth =====>   bkp 10.71.2.2/24

Each host reaches the other's service address (on lo) through a static route via the primary
(`10.71.0.2/32 via 10.71.1.2 dev pri src 10.71.0.1 proto static`, and the mirror on b), so a TCP connection
between the service addresses survives when both hosts move that route to the backup. `rto_min_ms` gives
those routes a locked `rto_min` metric (`ip route ... rto_min 5ms lock`: TCP's minimum retransmit timeout,
200 ms by default).

- `carrier_down(host)` sets the *other* end of the primary admin down: `host`'s end loses carrier, its routes
  stay. `hard_down()` sets both ends admin down: both lose carrier and the kernel deletes both hosts' routes
  via the primary (what a restore must re-add). `hard_up()`/`carrier_up(host)` undo them.
- `monitor` reads what each host's ports receive through AF_PACKET sockets (made in the host's namespace) with
  the kernel's receive timestamps: `flow_start(host, link, after_ns)` is when data bytes first arrived on that
  port after a moment.
- `stream()` is a long-lived TCP stream from a's service address to b's, sending a counter pattern; the
  receiver checks that every byte arrives once and in order.
- `agents(state_dir)` runs, per host, what a node agent would, in a process of its own: a real
  `LinkSource(netns=...)` feeding a `LinkWatchdog` that fails over through `KernelRouting`; its acks are
  collected, and `agents[host].routing` calls its KernelRouting (the pipeline's restore).
- `real_agents(bootstrap, state_dir, public_key)` runs, per host, the real node agent instead:
  `clocktower agent --actuate --sources links` with CLOCKTOWER_AGENT_NETNS naming the host's namespace (it
  talks to the broker from the root namespace and watches and routes inside the host's), node name
  `bed.node(host)`, the backup from CLOCKTOWER_AGENT_LINK_BACKUPS=pri=bkp; its watchdog's T_watchdog is
  `watchdog_ms` (CLOCKTOWER_ACTUATOR_WATCHDOG_MS).

`failover_bed()` skips the test (pytest) when the machine cannot build it, or raises BedUnavailable with
`skip=False` (the benchmark). Everything it creates is removed on exit.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import gc
import json
import os
import selectors
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clocktower.actuators.link_routing import RoutingError
from clocktower.actuators.link_watchdog import LinkWatchdog
from clocktower.actuators.route_table import KernelRouting
from clocktower.producers.agent.link_source import LinkSource
from clocktower.schemas.control import ControlAck

PRIMARY = "pri"
BACKUP = "bkp"
HOSTS = ("a", "b")
SERVICE = {"a": "10.71.0.1", "b": "10.71.0.2"}
ADDR = {("a", PRIMARY): "10.71.1.1", ("b", PRIMARY): "10.71.1.2",
        ("a", BACKUP): "10.71.2.1", ("b", BACKUP): "10.71.2.2"}
STREAM_PORT = 7171
REPO = Path(__file__).resolve().parents[1]
DATA_BYTES = 500           # a rise of the rx counter by this much is data, not ARP/neighbour chatter
_PATTERN_PERIOD = 251      # byte i of the stream is i % 251 (prime: no chunk size hides a shift)
_PATTERN = bytes(range(_PATTERN_PERIOD)) * (70_000 // _PATTERN_PERIOD + 2)
RECV_SIZE = 65_536
RTO_MIN_LOCK = 1 << 13     # RTAX_LOCK bit of RTAX_RTO_MIN: TCP uses a route's rto_min only when it is locked


class BedUnavailable(Exception):
    """The machine cannot build the bed (not root, no network namespaces)."""


def other(host: str) -> str:
    return "b" if host == "a" else "a"


def in_netns(ns: str, fn: Callable[[], Any]) -> Any:
    """Run fn on a fresh thread that entered namespace `ns` (setns changes only the calling thread)."""
    from pyroute2 import netns

    out: dict[str, Any] = {}

    def run() -> None:
        try:
            netns.setns(ns, flags=0)
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller
            out["error"] = e

    t = threading.Thread(target=run, name=f"in-netns-{ns}")
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out.get("value")


def _sysctl(path: str, value: str) -> None:
    Path("/proc/sys", path).write_text(value)


class PathMonitor:
    """What each host's ports receive, timed by the kernel: an AF_PACKET socket per (host, port) with
    SO_TIMESTAMPNS, read by one thread. A packet's time is when the kernel received it (the wall clock, as
    time.time_ns()), so how late the reader runs does not move it; nothing polls. Per port the received bytes
    are kept as (kernel time, running total) per packet (the newest `KEEP` packets)."""

    KEEP = 200_000

    def __init__(self, namespaces: dict[str, str], links: tuple[str, ...]) -> None:
        self._changes: dict[tuple[str, str], list[tuple[int, int]]] = {}   # (host, link) -> [(ts_ns, total)]
        self._dropped: dict[tuple[str, str], tuple[int, int]] = {}        # the newest entry trimmed away
        self._socks: dict[int, tuple[str, str, socket.socket]] = {}
        self._error: BaseException | None = None                          # what ended the reader, if it failed
        try:
            for host, ns in namespaces.items():
                for link in links:
                    sock = in_netns(ns, lambda link=link: _packet_socket(link))
                    self._socks[sock.fileno()] = (host, link, sock)
                    self._changes[host, link] = []
        except BaseException:
            for _, _, sock in self._socks.values():
                sock.close()
            raise
        self._cond = threading.Condition()
        self._wake_r, self._wake_w = socket.socketpair()
        self._thread = threading.Thread(target=self._run, name="bed-path-monitor", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._wake_w.send(b"x")
        self._thread.join(5.0)
        for _, _, sock in self._socks.values():
            sock.close()
        self._wake_r.close()
        self._wake_w.close()

    def _run(self) -> None:
        try:
            self._read()
        except BaseException as exc:   # not silently: flow_start raises it to the measuring caller
            with self._cond:
                self._error = exc
                self._cond.notify_all()
            raise

    def _read(self) -> None:
        sel = selectors.DefaultSelector()
        for fd in self._socks:
            sel.register(fd, selectors.EVENT_READ)
        sel.register(self._wake_r, selectors.EVENT_READ)
        totals = dict.fromkeys(self._changes, 0)
        try:
            while True:
                for key, _ in sel.select():
                    if key.fileobj is self._wake_r:
                        return
                    host, link, sock = self._socks[key.fd]
                    got = []
                    while True:
                        try:
                            data, anc, _, addr = sock.recvmsg(RECV_SIZE + 256, 64, socket.MSG_DONTWAIT)
                        except BlockingIOError:
                            break
                        except OSError as e:      # ENETDOWN, once, when the port goes down: it keeps working
                            if e.errno != errno.ENETDOWN:
                                raise
                            continue
                        if addr[2] == PACKET_OUTGOING:
                            continue
                        ts = next((_timespec_ns(d) for lvl, kind, d in anc
                                   if lvl == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS), time.time_ns())
                        totals[host, link] += len(data)
                        got.append((ts, totals[host, link]))
                    if got:
                        self._add(host, link, got)
        finally:
            sel.close()

    def _add(self, host: str, link: str, got: list[tuple[int, int]]) -> None:
        """Append a port's new (ts, total) entries; past 2 x KEEP, trim to the newest KEEP."""
        with self._cond:
            series = self._changes[host, link]
            series += got
            if len(series) > 2 * self.KEEP:
                self._dropped[host, link] = series[-self.KEEP - 1]
                del series[:-self.KEEP]
            self._cond.notify_all()

    def flow_start(self, host: str, link: str, after_ns: int, timeout_s: float = 5.0,
                   min_bytes: int = DATA_BYTES) -> int | None:
        """When (the kernel's receive time, ns since the epoch) `link` of `host` had received `min_bytes` more
        than it had at `after_ns`, or None after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                if self._error is not None:
                    raise RuntimeError("the path monitor's reader failed") from self._error
                series = self._changes[host, link]
                i = bisect.bisect_right(series, (after_ns, float("inf")))
                base = series[i - 1][1] if i else self._base_before_kept(host, link, after_ns)
                hit = next((ts for ts, total in series[i:] if total - base >= min_bytes), None)
                if hit is not None:
                    return hit
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(min(left, 0.05))

    def _base_before_kept(self, host: str, link: str, after_ns: int) -> int:
        """The running total at `after_ns`, which is older than every kept entry: 0 if nothing was trimmed,
        else the newest trimmed entry's total if that is no newer than `after_ns`; older than that is unknown."""
        dropped = self._dropped.get((host, link))
        if dropped is None:
            return 0
        if dropped[0] <= after_ns:
            return dropped[1]
        raise ValueError(f"{host}/{link}: {after_ns} is older than the {self.KEEP} packets kept")


PACKET_OUTGOING = 4
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)
ETH_P_ALL = 0x0003


def _packet_socket(ifname: str) -> socket.socket:
    """A raw packet socket on `ifname` (of the calling thread's namespace) that stamps what it receives."""
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 8 << 20)     # root: past rmem_max, no drops in bursts
    sock.bind((ifname, ETH_P_ALL))
    return sock


def _timespec_ns(data: bytes) -> int:
    sec, nsec = struct.unpack("=qq", data[:16])
    return sec * 1_000_000_000 + nsec


@dataclass
class StreamResult:
    sent: int
    received: int
    errors: list[str]
    max_stall_ms: float            # the longest gap between two reads at the receiver

    @property
    def ok(self) -> bool:
        return not self.errors and self.received == self.sent


class TcpStream:
    """A's service address -> B's: numbered bytes (i % 251), checked at B; one `chunk` every `interval_s`."""

    def __init__(self, bed: FailoverBed, chunk: int = 4096, interval_s: float = 0.0005) -> None:
        from pyroute2.netns import create_socket

        self.chunk, self.interval_s = chunk, interval_s
        self.sent = 0
        self.received = 0
        self.errors: list[str] = []
        self.max_stall_ms = 0.0
        self.result: StreamResult | None = None
        self._stop = threading.Event()
        self._progress = threading.Condition()
        listener = create_socket(bed.ns["b"], socket.AF_INET, socket.SOCK_STREAM, flags=0)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((SERVICE["b"], STREAM_PORT))
        listener.listen(1)
        self._tx = create_socket(bed.ns["a"], socket.AF_INET, socket.SOCK_STREAM, flags=0)
        self._tx.bind((SERVICE["a"], 0))
        self._tx.settimeout(10.0)
        self._tx.connect((SERVICE["b"], STREAM_PORT))
        listener.settimeout(10.0)
        self._rx, _ = listener.accept()
        listener.close()
        self._rx.settimeout(30.0)
        self._threads = [threading.Thread(target=self._send, name="bed-stream-tx", daemon=True),
                         threading.Thread(target=self._recv, name="bed-stream-rx", daemon=True)]
        for t in self._threads:
            t.start()

    def _send(self) -> None:
        try:
            while not self._stop.is_set():
                start = self.sent % _PATTERN_PERIOD
                self._tx.sendall(_PATTERN[start:start + self.chunk])
                self.sent += self.chunk
                time.sleep(self.interval_s)
            self._tx.shutdown(socket.SHUT_WR)
        except OSError as e:
            self.errors.append(f"send failed after {self.sent} bytes: {e}")

    def _recv(self) -> None:
        buf = bytearray(RECV_SIZE)
        last = time.monotonic()
        try:
            while True:
                n = self._rx.recv_into(buf)
                now = time.monotonic()
                self.max_stall_ms = max(self.max_stall_ms, (now - last) * 1e3)
                last = now
                if n == 0:
                    return
                start = self.received % _PATTERN_PERIOD
                if buf[:n] != _PATTERN[start:start + n] and not self.errors:
                    bad = next(i for i in range(n) if buf[i] != _PATTERN[start + i])
                    self.errors.append(f"byte {self.received + bad} is {buf[bad]}, expected "
                                       f"{(self.received + bad) % _PATTERN_PERIOD}: lost or reordered bytes")
                with self._progress:
                    self.received += n
                    self._progress.notify_all()
        except OSError as e:
            self.errors.append(f"receive failed after {self.received} bytes: {e}")
        finally:
            with self._progress:
                self._progress.notify_all()

    def wait_bytes(self, n: int, timeout_s: float = 10.0) -> None:
        """Block until the receiver has `n` bytes; AssertionError (with the state) if it does not in time."""
        deadline = time.monotonic() + timeout_s
        with self._progress:
            while self.received < n and not self.errors:
                left = deadline - time.monotonic()
                assert left > 0, f"stream stalled: {self.received} of {n} bytes after {timeout_s} s"
                self._progress.wait(left)
        assert not self.errors, self.errors

    def stop(self, timeout_s: float = 20.0) -> StreamResult:
        """Stop sending, let the receiver read to the end, and give the verdict."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout_s)
        if any(t.is_alive() for t in self._threads):
            self.errors.append(f"stream did not finish within {timeout_s} s ({self.received} of {self.sent})")
        for s in (self._tx, self._rx):
            s.close()
        self.result = StreamResult(self.sent, self.received, list(self.errors), self.max_stall_ms)
        return self.result


class _RemoteRouting:
    """LinkRouting that runs each call in a host agent's process (so the bed's and the agent's views agree)."""

    def __init__(self, agent: HostAgent) -> None:
        self._agent = agent

    def remember(self, link: str, backup: str) -> str:
        return str(self._agent.call("remember", link, backup))

    def fail_over(self, link: str, backup: str) -> str:
        return str(self._agent.call("fail_over", link, backup))

    def restore(self, link: str, backup: str) -> str:
        return str(self._agent.call("restore", link, backup))

    def on_backup(self, link: str) -> bool:
        return bool(self._agent.call("on_backup", link))


class HostAgent:
    """One host's link agent in a process of its own, as on a real node (it does not share the workload's
    interpreter and GIL): a real LinkSource in the host's namespace feeding a LinkWatchdog({pri: bkp}) that
    fails over through KernelRouting. Its watchdog acks land in `acks`; `routing` calls its KernelRouting
    (e.g. the pipeline's restore). Talks JSON lines over the child's stdin/stdout (`_agent_main`)."""

    def __init__(self, host: str, ns: str, state_path: Path, delay_s: float,
                 on_ack: Callable[[str, ControlAck], None] | None = None, start_timeout_s: float = 30.0) -> None:
        self.host = host
        self.acks: list[ControlAck] = []
        self.routing = _RemoteRouting(self)
        self._on_ack = on_ack
        self._replies: dict[int, dict[str, Any]] = {}
        self._cond = threading.Condition()
        self._ready = False
        self._seq = 0
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tests.failover_bed", host, ns, str(state_path), str(delay_s),
             ADDR[other(host), BACKUP]], cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            bufsize=1)
        self._reader = threading.Thread(target=self._read, name=f"bed-agent-{host}", daemon=True)
        self._reader.start()
        with self._cond:
            if not self._cond.wait_for(lambda: self._ready or self._proc.poll() is not None, start_timeout_s):
                self.close()
                raise TimeoutError(f"host {host}'s agent did not start within {start_timeout_s} s")
        if not self._ready:
            raise RuntimeError(f"host {host}'s agent exited with {self._proc.returncode} (its stderr is above)")

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            msg = json.loads(line)
            if "ack" in msg:
                ack = ControlAck.model_validate(msg["ack"])
                self.acks.append(ack)
                if self._on_ack is not None:
                    self._on_ack(self.host, ack)
            with self._cond:
                if msg.get("ready"):
                    self._ready = True
                if "reply" in msg:
                    self._replies[msg["reply"]] = msg
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def call(self, op: str, *args: str, timeout_s: float = 10.0) -> Any:
        """Run `routing.<op>(*args)` in the agent; its RoutingError is raised here with the same message."""
        with self._cond:
            self._seq += 1
            seq = self._seq
            assert self._proc.stdin is not None
            self._proc.stdin.write(json.dumps({"id": seq, "op": op, "args": list(args)}) + "\n")
            self._proc.stdin.flush()
            if not self._cond.wait_for(lambda: seq in self._replies or self._proc.poll() is not None, timeout_s):
                raise TimeoutError(f"host {self.host}'s agent did not answer {op} within {timeout_s} s")
            reply = self._replies.pop(seq, None)
        if reply is None:
            raise RuntimeError(f"host {self.host}'s agent exited with {self._proc.returncode}")
        if not reply["ok"]:
            raise RoutingError(reply["error"])
        return reply["result"]

    def close(self) -> None:
        """EOF on its stdin stops the agent (source, watchdog, routing); killed if it does not in 10 s."""
        with contextlib.suppress(OSError):
            assert self._proc.stdin is not None
            self._proc.stdin.close()
        try:
            self._proc.wait(10.0)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._reader.join(5.0)


def _agent_main(host: str, ns: str, state_path: str, delay_s: str, gateway: str) -> None:
    """The host agent process (see HostAgent): JSON lines out (ready, acks, replies), requests in."""
    lock = threading.Lock()

    def say(obj: dict[str, Any]) -> None:
        with lock:
            sys.stdout.write(json.dumps(obj) + "\n")
            sys.stdout.flush()

    routing = KernelRouting(Path(state_path), netns=ns, gateways={BACKUP: gateway})
    watchdog = LinkWatchdog(f"host-{host}", routing, {PRIMARY: BACKUP},
                            lambda ack: say({"ack": ack.model_dump(mode="json")}), delay_s=float(delay_s))
    source = LinkSource(f"host-{host}", interfaces=[PRIMARY, BACKUP], netns=ns, listeners=[watchdog.observe])
    source.start(lambda events: None)
    # Start-up objects (imports, pyroute2's tables) move out of the collector's reach: a full collection
    # over them took 40-160 ms on the test VM, stalling a failover that fell into it (an RTO-long stall).
    gc.freeze()
    say({"ready": True})
    ops: dict[str, Callable[..., Any]] = {"remember": routing.remember, "fail_over": routing.fail_over,
                                          "restore": routing.restore, "on_backup": routing.on_backup}
    try:
        for line in sys.stdin:
            req = json.loads(line)
            try:
                say({"reply": req["id"], "ok": True, "result": ops[req["op"]](*req["args"])})
            except RoutingError as e:
                say({"reply": req["id"], "ok": False, "error": str(e)})
    finally:
        source.stop()
        watchdog.stop()
        routing.close()


class RealAgent:
    """One host's real `clocktower agent --actuate --sources links` process (see FailoverBed.real_agents)."""

    def __init__(self, host: str, node: str, ns: str, bootstrap: str, state_dir: Path, public_key: Path,
                 watchdog_ms: float, report_s: float, env: dict[str, str] | None = None) -> None:
        self.host, self.node = host, node
        self.state_dir = state_dir
        self.routes_file = state_dir / "actuator" / "routes.json"
        self.log_path = state_dir / "agent.log"
        state_dir.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "clocktower", "agent", "--actuate", "--sources", "links", "--node", node,
             "--kafka", bootstrap, "--spool-dir", str(state_dir / "spool"),
             "--link-interface", PRIMARY, "--link-interface", BACKUP, "--duration", "3600", "--json"],
            cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self._log,
            env={**os.environ, **(env or {}),
                 "CLOCKTOWER_AGENT_NETNS": ns, "CLOCKTOWER_AGENT_LINK_BACKUPS": f"{PRIMARY}={BACKUP}",
                 "CLOCKTOWER_AGENT_LINK_REPORT_S": str(report_s),
                 "CLOCKTOWER_ACTUATOR_STATE_DIR": str(state_dir / "actuator"),
                 "CLOCKTOWER_ACTUATOR_WATCHDOG_MS": str(watchdog_ms),
                 "CLOCKTOWER_CONTROL_PUBLIC_KEY_FILE": str(public_key), "PYTHONUNBUFFERED": "1"})
        self.report: dict[str, Any] | None = None

    def ready(self) -> bool:
        """Its watchdog has seen the primary up and remembered its routes (the routing backend runs)."""
        try:
            return PRIMARY in json.loads(self.routes_file.read_text()).get("links", {})
        except (OSError, ValueError):
            return False

    def alive(self) -> bool:
        return self._proc.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout_s: float = 20.0) -> dict[str, Any] | None:
        """SIGTERM (the agent delivers what it holds, then prints its JSON report); killed after `timeout_s`."""
        if self._proc.poll() is None:
            self._proc.terminate()
        try:
            out, _ = self._proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            out, _ = self._proc.communicate()
        self._log.close()
        with contextlib.suppress(ValueError, IndexError):
            self.report = json.loads(out.decode().strip().splitlines()[-1])
        return self.report


class FailoverBed:
    PRIMARY = PRIMARY
    BACKUP = BACKUP

    def __init__(self, prefix: str, rto_min_ms: int | None = None) -> None:
        self.rto_min_ms = rto_min_ms
        tag = f"{os.getpid() % 100000}"
        self.prefix = prefix
        self.ns = {host: f"{prefix}-{host}-{tag}" for host in HOSTS}
        self._tmp = {(host, link): f"c{prefix[:3]}{tag}{host}{link[0]}" for host in HOSTS for link in (PRIMARY, BACKUP)}
        self._ipr: dict[str, Any] = {}
        self._indexes: dict[tuple[str, str], int] = {}
        self.monitor: PathMonitor

    # -- building and removing -----------------------------------------------------------------

    def build(self) -> None:
        from pyroute2 import IPRoute, netns

        for host in HOSTS:
            netns.create(self.ns[host])
            in_netns(self.ns[host], _quiet_sysctls)
        with IPRoute() as ip:
            for link in (PRIMARY, BACKUP):
                ip.link("add", ifname=self._tmp["a", link], kind="veth", peer={"ifname": self._tmp["b", link]})
                for host in HOSTS:
                    ip.link("set", index=ip.link_lookup(ifname=self._tmp[host, link])[0], net_ns_fd=self.ns[host])
        for host in HOSTS:
            from pyroute2 import IPRoute as NsIPRoute

            ipr = self._ipr[host] = NsIPRoute(netns=self.ns[host], flags=0)
            lo = ipr.link_lookup(ifname="lo")[0]
            ipr.link("set", index=lo, state="up")
            ipr.addr("add", index=lo, address=SERVICE[host], prefixlen=32)
            for link in (PRIMARY, BACKUP):
                index = ipr.link_lookup(ifname=self._tmp[host, link])[0]
                ipr.link("set", index=index, ifname=link)
                self._indexes[host, link] = index
                ipr.addr("add", index=index, address=ADDR[host, link], prefixlen=24)
                ipr.link("set", index=index, state="up")
        for host in HOSTS:
            self.wait_carrier(host, PRIMARY, True)
            self.wait_carrier(host, BACKUP, True)
            self._ipr[host].route("add", dst=SERVICE[other(host)], dst_len=32, gateway=ADDR[other(host), PRIMARY],
                                  prefsrc=SERVICE[host], proto=4,
                                  **({"metrics": {"rto_min": self.rto_min_ms, "lock": RTO_MIN_LOCK}}
                                     if self.rto_min_ms else {}))
        self.monitor = PathMonitor(self.ns, (PRIMARY, BACKUP))

    def remove(self) -> None:
        from pyroute2 import IPRoute, netns

        if hasattr(self, "monitor"):
            self.monitor.close()
        for ipr in self._ipr.values():
            ipr.close()
        for name in self.ns.values():
            with contextlib.suppress(OSError, FileNotFoundError):
                netns.remove(name)
        with IPRoute() as ip:                       # ends still in this namespace if building failed early
            for name in self._tmp.values():
                for index in ip.link_lookup(ifname=name):
                    ip.link("del", index=index)

    def add_service_device(self, name: str = "svc") -> str:
        """Per host, an interface carrying the host's service address too, and returns its name. A program
        that binds by interface name (gloo's GLOO_SOCKET_IFNAME) takes the interface's first address, which on
        lo is 127.0.0.1: this one has only the service address, still routed to the peer via the primary."""
        for host in HOSTS:
            ipr = self._ipr[host]
            # a veth pair with both ends in the host (the dummy module is not everywhere): `name` carries the
            # address, its peer only keeps it up
            ipr.link("add", ifname=name, kind="veth", peer={"ifname": f"{name}-end"})
            for ifname in (f"{name}-end", name):
                ipr.link("set", index=ipr.link_lookup(ifname=ifname)[0], state="up")
            ipr.addr("add", index=ipr.link_lookup(ifname=name)[0], address=SERVICE[host], prefixlen=32)
        return name

    # -- links ---------------------------------------------------------------------------------

    def ip(self, host: str) -> Any:
        """The bed's own IPRoute in `host`'s namespace (not thread-safe: use from one thread)."""
        return self._ipr[host]

    def set_admin(self, host: str, link: str, up: bool) -> None:
        """One netlink request (the index is looked up once: a down is timed from just before this call)."""
        ipr = self._ipr[host]
        index = self._indexes.get((host, link))
        if index is None:
            index = self._indexes[host, link] = ipr.link_lookup(ifname=link)[0]
        ipr.link("set", index=index, state="up" if up else "down")

    def carrier_down(self, host: str, link: str = PRIMARY) -> None:
        """`host`'s end of `link` loses carrier (the far end goes admin down); `host`'s routes stay."""
        self.set_admin(other(host), link, False)

    def carrier_up(self, host: str, link: str = PRIMARY) -> None:
        self.set_admin(other(host), link, True)

    def hard_down(self, link: str = PRIMARY) -> None:
        """Both ends admin down: no carrier anywhere, and the kernel deletes both hosts' routes via it."""
        for host in HOSTS:
            self.set_admin(host, link, False)

    def hard_up(self, link: str = PRIMARY) -> None:
        for host in HOSTS:
            self.set_admin(host, link, True)

    def carrier(self, host: str, link: str) -> bool:
        msg = self._ipr[host].link("get", ifname=link)[0]
        return bool(msg["flags"] & 1 and msg.get("carrier"))

    def wait_carrier(self, host: str, link: str, up: bool, timeout_s: float = 5.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.carrier(host, link) != up:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{host}/{link}: carrier not {'up' if up else 'down'} after {timeout_s} s")
            time.sleep(0.002)

    def route_to_peer(self, host: str) -> tuple[str, str | None]:
        """(device, gateway) of `host`'s route to the other host's service address; ("", None) if none."""
        ipr = self._ipr[host]
        for msg in ipr.route("dump", family=socket.AF_INET):
            if msg.get("dst") == SERVICE[other(host)] and msg["dst_len"] == 32:
                name = ipr.link("get", index=msg.get("oif"))[0].get("ifname")
                return name, msg.get("gateway")
        return "", None

    # -- what runs on the hosts ----------------------------------------------------------------

    def routing(self, host: str, state_path: Path) -> KernelRouting:
        """`host`'s kernel routing, the backup's gateway configured (the far end's backup address)."""
        return KernelRouting(state_path, netns=self.ns[host], gateways={BACKUP: ADDR[other(host), BACKUP]})

    @contextmanager
    def agents(self, state_dir: Path, delay_s: float = 0.05,
               on_ack: Callable[[str, ControlAck], None] | None = None) -> Iterator[dict[str, HostAgent]]:
        """Per host, a HostAgent process (LinkSource -> LinkWatchdog -> KernelRouting); stopped on exit."""
        agents: dict[str, HostAgent] = {}
        try:
            for host in HOSTS:
                agents[host] = HostAgent(host, self.ns[host], Path(state_dir) / f"routing-{host}.json", delay_s,
                                         on_ack)
            yield agents
        finally:
            for agent in agents.values():
                agent.close()

    def node(self, host: str) -> str:
        """`host`'s node name for the real agents (the namespace's name: unique per bed)."""
        return self.ns[host]

    @contextmanager
    def real_agents(self, bootstrap: str, state_dir: Path, public_key: Path, watchdog_ms: float = 50.0,
                    report_s: float = 0.2, env: dict[str, str] | None = None,
                    start_timeout_s: float = 60.0) -> Iterator[dict[str, RealAgent]]:
        """Per host, a real `clocktower agent --actuate --sources links` (see the module doc), started and
        ready (its watchdog remembered the primary's routes); stopped on exit (`agents[host].report` then
        holds its JSON report)."""
        agents: dict[str, RealAgent] = {}
        try:
            for host in HOSTS:
                agents[host] = RealAgent(host, self.node(host), self.ns[host], bootstrap,
                                         Path(state_dir) / f"agent-{host}", public_key, watchdog_ms, report_s, env)
            deadline = time.monotonic() + start_timeout_s
            for agent in agents.values():
                while not agent.ready():
                    if not agent.alive():
                        raise RuntimeError(f"host {agent.host}'s agent exited:\n{agent.log()}")
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"host {agent.host}'s agent not ready after {start_timeout_s} s:\n"
                                           f"{agent.log()}")
                    time.sleep(0.05)
            yield agents
        finally:
            for agent in agents.values():
                agent.stop()

    @contextmanager
    def stream(self, chunk: int = 4096, interval_s: float = 0.0005) -> Iterator[TcpStream]:
        """A running TcpStream; stopped (and its `result` set) on exit."""
        s = TcpStream(self, chunk=chunk, interval_s=interval_s)
        try:
            yield s
        finally:
            s.stop()


def _quiet_sysctls() -> None:
    """In a new namespace: no reverse-path filter (a reply may come in on the other port for a moment
    while only one host has failed over) and no IPv6 (its neighbour chatter would look like traffic)."""
    for conf in ("all", "default"):
        _sysctl(f"net/ipv4/conf/{conf}/rp_filter", "0")
        _sysctl(f"net/ipv6/conf/{conf}/disable_ipv6", "1")


@contextmanager
def failover_bed(prefix: str = "fob", skip: bool = True, rto_min_ms: int | None = None) -> Iterator[FailoverBed]:
    """Build the bed (see the module doc); skip the test (or raise BedUnavailable) where it cannot be."""
    if sys.platform != "linux" or os.geteuid() != 0:
        _unavailable("building the failover bed needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) on Linux", skip)
    bed = FailoverBed(prefix, rto_min_ms)
    try:
        try:
            bed.build()
        except (OSError, ImportError) as e:
            _unavailable(f"cannot build network namespaces joined by veth pairs here: {e}", skip)
        yield bed
    finally:
        bed.remove()


def _unavailable(reason: str, skip: bool) -> None:
    if skip:
        import pytest

        pytest.skip(reason)
    raise BedUnavailable(reason)


if __name__ == "__main__":
    _agent_main(*sys.argv[1:])
