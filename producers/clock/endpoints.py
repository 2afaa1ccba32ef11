"""Addresses for the clock-probe agent: parsing host:port, and the default bind on the cluster interface.

The agent must face the other nodes and nothing else, so it binds one address, never every interface
by default: the address of `--clock-interface` if given, else the local address the kernel would use
to reach the first peer (a UDP connect, which sends nothing), else 127.0.0.1 when there are no peers.
A wildcard bind (0.0.0.0 or ::) is refused unless asked for explicitly.
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct
from collections.abc import Sequence

DEFAULT_PORT = 7373
SIOCGIFADDR = 0x8915


def parse_endpoint(text: str, family: int = socket.AF_UNSPEC, what: str = "peer",
                   allow_port_zero: bool = False) -> tuple[int, tuple]:
    """'host:port' or '[v6 address]:port' to (address family, socket address); ValueError saying what is wrong."""
    text = text.strip()
    if text.startswith("["):
        host, sep, port_text = text[1:].partition("]:")
    else:
        host, sep, port_text = text.rpartition(":")
    if not sep or not host or not port_text:
        raise ValueError(f"bad {what} address {text!r}: expected host:port or [ipv6]:port")
    try:
        port = int(port_text, 10)
    except ValueError:
        raise ValueError(f"bad {what} address {text!r}: port {port_text!r} is not a number") from None
    if not (0 if allow_port_zero else 1) <= port <= 65535:
        raise ValueError(f"bad {what} address {text!r}: port {port} out of range")
    try:
        infos = socket.getaddrinfo(host, port, family, socket.SOCK_DGRAM, 0, socket.AI_NUMERICSERV)
    except (socket.gaierror, UnicodeError) as exc:
        reason = exc.strerror if isinstance(exc, socket.gaierror) else str(exc)
        raise ValueError(f"bad {what} address {text!r}: {reason}") from None
    fam, _type, _proto, _canon, sockaddr = infos[0]
    return fam, sockaddr


def format_endpoint(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def is_wildcard(sockaddr: tuple) -> bool:
    """Whether a socket address is 0.0.0.0 or :: (every interface)."""
    return ipaddress.ip_address(sockaddr[0].split("%", 1)[0]).is_unspecified


def interface_address(interface: str, family: int = socket.AF_INET) -> str:
    """The first address of `interface` in `family` (IPv4: SIOCGIFADDR; IPv6: /proc/net/if_inet6, global first)."""
    if family == socket.AF_INET6:
        found: list[tuple[int, str]] = []
        try:
            with open("/proc/net/if_inet6", encoding="ascii") as f:
                for line in f:
                    hexaddr, _index, _plen, scope, _flags, name = line.split()
                    if name == interface:
                        address = str(ipaddress.IPv6Address(bytes.fromhex(hexaddr)))
                        found.append((int(scope, 16), address if scope == "00" else f"{address}%{interface}"))
        except OSError as exc:
            raise ValueError(f"cannot list the IPv6 addresses of {interface}: {exc.strerror}") from None
        if not found:
            raise ValueError(f"interface {interface!r} has no IPv6 address")
        return min(found)[1]
    if not interface or len(interface.encode()) >= 16:
        raise ValueError(f"bad interface name {interface!r}")
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            res = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", interface.encode()))
    except OSError as exc:
        raise ValueError(f"interface {interface!r} has no IPv4 address: {exc.strerror}") from None
    return socket.inet_ntoa(res[20:24])


def route_source_address(family: int, peer: tuple) -> str:
    """The local address the kernel picks to reach `peer` (a connected UDP socket; nothing is sent)."""
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        try:
            s.connect(peer)
        except OSError as exc:
            raise ValueError(f"no route to clock peer {format_endpoint(*peer[:2])}: {exc.strerror}") from None
        return s.getsockname()[0]


def default_bind(peers: Sequence[str], interface: str | None, port: int = DEFAULT_PORT) -> str:
    """host:port to bind when none is given: on the cluster interface, never every interface."""
    family = socket.AF_INET
    first = None
    if peers:
        family, first = parse_endpoint(peers[0])
    if interface:
        host = interface_address(interface, family)
    elif first is not None:
        host = route_source_address(family, first)
    else:
        host = "127.0.0.1"
    return format_endpoint(host, port)
