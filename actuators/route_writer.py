"""IPv4 `route replace` on a plain rtnetlink socket: the failover's latency-critical write.

pyroute2's synchronous IPRoute runs an asyncio loop per call: ~1.1 ms per route replace on the test VM, and
more when other threads hold the GIL. The message is small and fixed, so it is packed here and all replaces
of one failover go out back to back before their acknowledgements are read (~0.05 ms a route). Reading
(dumps, link lookups) stays with pyroute2, which parses far more than we would want to.
"""

from __future__ import annotations

import os
import socket
import struct
import threading
from dataclasses import dataclass

from pyroute2 import netns as pr_netns

RTM_NEWROUTE = 24
NLMSG_ERROR = 2
NLM_F_REQUEST, NLM_F_ACK, NLM_F_REPLACE, NLM_F_CREATE = 0x1, 0x4, 0x100, 0x400
RTA_DST, RTA_OIF, RTA_GATEWAY, RTA_PRIORITY, RTA_PREFSRC, RTA_METRICS, RTA_TABLE = 1, 4, 5, 6, 7, 8, 15
RTN_UNICAST = 1
_NLMSGHDR = struct.Struct("=IHHII")
_RTMSG = struct.Struct("=BBBBBBBBI")


@dataclass(frozen=True)
class RouteSpec:
    """One IPv4 unicast route to write (None: attribute absent)."""

    dst: str | None
    dst_len: int
    table: int
    priority: int
    tos: int
    proto: int
    scope: int
    oif: int
    gateway: str | None
    prefsrc: str | None
    metrics: tuple[tuple[int, int], ...] = ()     # (RTAX_* number, u32 value): mtu, rto_min, ...


def _attr(kind: int, payload: bytes) -> bytes:
    data = struct.pack("=HH", 4 + len(payload), kind) + payload
    return data + b"\0" * (-len(data) % 4)


def pack_replace(spec: RouteSpec, seq: int) -> bytes:
    """An RTM_NEWROUTE create|replace request asking for an ack."""
    body = _RTMSG.pack(socket.AF_INET, spec.dst_len, 0, spec.tos, spec.table if spec.table < 256 else 252,
                       spec.proto, spec.scope, RTN_UNICAST, 0)
    body += _attr(RTA_TABLE, struct.pack("=I", spec.table)) + _attr(RTA_OIF, struct.pack("=I", spec.oif))
    if spec.dst is not None:
        body += _attr(RTA_DST, socket.inet_aton(spec.dst))
    if spec.gateway is not None:
        body += _attr(RTA_GATEWAY, socket.inet_aton(spec.gateway))
    if spec.prefsrc is not None:
        body += _attr(RTA_PREFSRC, socket.inet_aton(spec.prefsrc))
    if spec.priority:
        body += _attr(RTA_PRIORITY, struct.pack("=I", spec.priority))
    if spec.metrics:
        body += _attr(RTA_METRICS, b"".join(_attr(kind, struct.pack("=I", value)) for kind, value in spec.metrics))
    flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_REPLACE | NLM_F_CREATE
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(body), RTM_NEWROUTE, flags, seq, 0) + body


class RouteWriter:
    """A NETLINK_ROUTE socket (inside `netns` if given) that replaces routes and reports each one's errno."""

    def __init__(self, netns: str | None = None) -> None:
        if netns is None:
            self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
        else:
            self._sock = pr_netns.create_socket(netns, socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE,
                                                flags=0)
        self._sock.bind((0, 0))
        self._sock.settimeout(5.0)
        self._seq = 0
        self._lock = threading.Lock()

    def close(self) -> None:
        self._sock.close()

    def replace(self, specs: list[RouteSpec]) -> list[int]:
        """Replace every route (sent back to back); the errno of each, in order (0 = done)."""
        with self._lock:
            first = self._seq + 1
            for spec in specs:
                self._seq += 1
                self._sock.send(pack_replace(spec, self._seq))
            results: dict[int, int] = {}
            while len(results) < len(specs):
                data = self._sock.recv(65536)
                offset = 0
                while offset + _NLMSGHDR.size <= len(data):
                    length, kind, _, seq, _ = _NLMSGHDR.unpack_from(data, offset)
                    if kind == NLMSG_ERROR and first <= seq <= self._seq:
                        results[seq] = -struct.unpack_from("=i", data, offset + _NLMSGHDR.size)[0]
                    offset += max(length + (-length % 4), _NLMSGHDR.size)
            return [results[seq] for seq in range(first, self._seq + 1)]


def describe(code: int) -> str:
    return os.strerror(code) if code else "ok"

