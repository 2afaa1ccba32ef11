"""Traffic between two network namespaces for the kernel QoS tests: bulk TCP streams in the low class and a 200 Hz
UDP probe whose one-way delays (both ends share the host's clock, so they are exact) and arrival ports are kept.

Used by tests/test_actuator_qos.py (a rate limit) and tests/test_flow_redirect.py (a redirect).
"""

from __future__ import annotations

import contextlib
import socket
import statistics
import struct
import threading
import time

from tests.failover_bed import in_netns

SO_PRIORITY = 12
IP_PKTINFO = 8


def bound(kind: int, address: str, port: int) -> socket.socket:
    s = socket.socket(socket.AF_INET, kind)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((address, port))
    return s


class Traffic:
    """`streams` bulk TCP streams sender -> `dst` (skb priority 0: the low class) and a UDP probe to it, sent with
    `probe_priority` (None: left unmarked, for a classifier to mark) from `probe_source` (None: any)."""

    def __init__(self, sender: str, receiver: str, dst: str, bulk_port: int, probe_port: int, streams: int,
                 probe_priority: int | None = None, probe_source: tuple[str, int] | None = None) -> None:
        self.sender, self.receiver, self.dst = sender, receiver, dst
        self.bulk_port, self.probe_port, self.streams = bulk_port, probe_port, streams
        self.probe_priority, self.probe_source = probe_priority, probe_source
        self.stop = threading.Event()
        self.bulk_on = threading.Event()
        self.delays: list[tuple[float, float, int]] = []   # (receive time, one-way delay ms, arrival ifindex)
        self.bulk: list[tuple[float, int]] = []             # (receive time, bytes) of the bulk streams
        self.threads: list[threading.Thread] = []
        self.socks: list[socket.socket] = []

    def start(self) -> None:
        listener = in_netns(self.receiver, lambda: bound(socket.SOCK_STREAM, self.dst, self.bulk_port))
        listener.listen(self.streams)
        probes = in_netns(self.receiver, lambda: bound(socket.SOCK_DGRAM, self.dst, self.probe_port))
        probes.setsockopt(socket.IPPROTO_IP, IP_PKTINFO, 1)
        self.socks += [listener, probes]
        self._spawn(self._accept, listener)
        self._spawn(self._receive_probes, probes)
        self._spawn(lambda: in_netns(self.sender, self._send_probes))
        for _ in range(self.streams):
            self._spawn(lambda: in_netns(self.sender, self._send_bulk))

    def _spawn(self, fn, *args) -> None:  # noqa: ANN001
        t = threading.Thread(target=fn, args=args, daemon=True)
        t.start()
        self.threads.append(t)

    def _accept(self, listener: socket.socket) -> None:
        listener.settimeout(0.5)
        while not self.stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            conn.settimeout(0.2)
            self.socks.append(conn)
            self._spawn(self._drain, conn)

    def _drain(self, conn: socket.socket) -> None:
        while not self.stop.is_set():
            with contextlib.suppress(OSError):
                data = conn.recv(1 << 16)
                if not data:
                    return
                self.bulk.append((time.monotonic(), len(data)))

    def _send_bulk(self) -> None:
        self.bulk_on.wait()
        s = socket.create_connection((self.dst, self.bulk_port), timeout=2)
        s.setsockopt(socket.SOL_SOCKET, SO_PRIORITY, 0)   # the low class (the qdisc's default)
        s.settimeout(0.2)
        self.socks.append(s)
        chunk = b"x" * 65536
        while not self.stop.is_set():
            with contextlib.suppress(OSError):
                s.send(chunk)

    def _send_probes(self) -> None:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        if self.probe_priority is not None:
            s.setsockopt(socket.SOL_SOCKET, SO_PRIORITY, self.probe_priority)
        if self.probe_source is not None:
            s.bind(self.probe_source)
        self.socks.append(s)
        while not self.stop.is_set():
            s.sendto(struct.pack("!q", time.clock_gettime_ns(time.CLOCK_REALTIME)) + b"p" * 100,
                     (self.dst, self.probe_port))
            time.sleep(0.005)

    def _receive_probes(self, s: socket.socket) -> None:
        s.settimeout(0.2)
        while not self.stop.is_set():
            try:
                data, anc, _, _ = s.recvmsg(2048, 64)
            except OSError:
                continue
            now = time.clock_gettime_ns(time.CLOCK_REALTIME)
            ifindex = next((struct.unpack("i", d[:4])[0] for _, typ, d in anc if typ == IP_PKTINFO), -1)
            self.delays.append((time.monotonic(), (now - struct.unpack("!q", data[:8])[0]) / 1e6, ifindex))

    def bulk_mbit(self, t: float, seconds: float) -> float:
        """The bulk streams' received rate over [t, t + seconds] (already past), Mbit/s."""
        return sum(n for at, n in list(self.bulk) if t <= at <= t + seconds) * 8 / seconds / 1e6

    def probes_after(self, t: float, seconds: float) -> tuple[float, set[int]]:
        """The probes' median delay over [t, t + seconds] (waited for) and the ports they arrived on."""
        time.sleep(max(0.0, t + seconds - time.monotonic()))
        xs = [(d, i) for at, d, i in list(self.delays) if t <= at <= t + seconds]
        assert len(xs) > 20, f"only {len(xs)} probes arrived"
        return statistics.median(d for d, _ in xs), {i for _, i in xs}

    def p50_after(self, t: float, seconds: float) -> float:
        return self.probes_after(t, seconds)[0]

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=3)
        for s in self.socks:
            with contextlib.suppress(OSError):
                s.close()
