"""Kernel timestamps for a UDP socket: socket options, NIC capabilities and ancillary-data parsing.

`TimestampedSocket` is the whole socket layer of the clock-probe agent. It
binds one non-blocking UDP socket and asks the kernel to timestamp every
datagram it sends and receives:

  RX  SO_TIMESTAMPING with SOF_TIMESTAMPING_RX_SOFTWARE | SOFTWARE (the
      timestamp is taken when the packet enters the stack), read from the
      SCM_TIMESTAMPING control message of recvmsg. With `mode="hardware"`
      the NIC's raw hardware timestamp (RX_HARDWARE | RAW_HARDWARE) is used
      instead. If SO_TIMESTAMPING is refused, SO_TIMESTAMPNS; if that is
      refused too, clock_gettime(CLOCK_REALTIME) right after recvmsg.
  TX  SOF_TIMESTAMPING_TX_SOFTWARE (taken by the driver as it hands the packet
      to the device; TX_HARDWARE in hardware mode), returned on the socket's
      error queue (recvmsg MSG_ERRQUEUE) with OPT_TSONLY, so only the
      timestamp comes back, not the packet. OPT_ID tags each send with a
      32-bit key: set explicitly per send with the SCM_TS_OPT_ID control
      message (Linux 6.13+), else the kernel's per-socket counter (one per
      timestamped send, from 0), mirrored here. If the kernel sends no TX
      timestamps, the CLOCK_REALTIME reading taken just before sendto.

`modes` says which of these is in use. The constants are the asm-generic
Linux values (x86_64, arm64, riscv64); elsewhere the socket falls back to
userspace timestamps.
"""

from __future__ import annotations

import array
import ctypes
import errno
import fcntl
import logging
import os
import socket
import struct
import sys
import time
from dataclasses import dataclass
from typing import Literal

log = logging.getLogger(__name__)

# <asm-generic/socket.h>; the _OLD variants carry a 64-bit timespec on 64-bit ABIs.
SO_TIMESTAMPNS = 35
SCM_TIMESTAMPNS = SO_TIMESTAMPNS
SO_TIMESTAMPING = 37
SCM_TIMESTAMPING = SO_TIMESTAMPING
SCM_TS_OPT_ID = 81

# <linux/net_tstamp.h>
SOF_TIMESTAMPING_TX_HARDWARE = 1 << 0
SOF_TIMESTAMPING_TX_SOFTWARE = 1 << 1
SOF_TIMESTAMPING_RX_HARDWARE = 1 << 2
SOF_TIMESTAMPING_RX_SOFTWARE = 1 << 3
SOF_TIMESTAMPING_SOFTWARE = 1 << 4
SOF_TIMESTAMPING_RAW_HARDWARE = 1 << 6
SOF_TIMESTAMPING_OPT_ID = 1 << 7
SOF_TIMESTAMPING_OPT_TSONLY = 1 << 11
HWTSTAMP_TX_ON = 1
HWTSTAMP_FILTER_ALL = 1

# <linux/errqueue.h>, <linux/in.h>, <linux/in6.h>
SO_EE_ORIGIN_TIMESTAMPING = 4
SCM_TSTAMP_SND = 0
IP_RECVERR = 11
IPV6_RECVERR = 25

# <linux/sockios.h>, <linux/ethtool.h>
SIOCETHTOOL = 0x8946
SIOCSHWTSTAMP = 0x89B0
SIOCGHWTSTAMP = 0x89B1
ETHTOOL_GET_TS_INFO = 0x41

_TIMESPEC = struct.Struct("=qq")
_SCM_TIMESTAMPING = struct.Struct("=qqqqqq")       # struct scm_timestamping: ts[0] sw, ts[1] legacy, ts[2] raw hw
_EXTENDED_ERR = struct.Struct("=IBBBBII")           # struct sock_extended_err (the offender address follows)
_TS_INFO = struct.Struct("=IIiI3II3I")              # struct ethtool_ts_info
_HWTSTAMP_CONFIG = struct.Struct("=iii")            # struct hwtstamp_config
_U32 = struct.Struct("=I")
_CMSG_U32 = struct.Struct("=QiiI4x")                # struct cmsghdr (64-bit) + one u32, padded: CMSG_SPACE(4)
_ANC_SPACE = socket.CMSG_SPACE(_SCM_TIMESTAMPING.size) + socket.CMSG_SPACE(_EXTENDED_ERR.size + 28) + 64
_KERNEL_ABI_OK = sys.platform == "linux" and struct.calcsize("P") == 8

Mode = Literal["software", "hardware", "auto"]
RxMode = Literal["hardware", "software", "timestampns", "userspace"]
TxMode = Literal["hardware", "software", "userspace"]
TxMatch = Literal["scm_ts_opt_id", "opt_id_counter", "none"]


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class _MsgHdr(ctypes.Structure):
    _fields_ = [("name", ctypes.c_void_p), ("namelen", ctypes.c_uint32), ("iov", ctypes.POINTER(_IoVec)),
                ("iovlen", ctypes.c_size_t), ("control", ctypes.c_void_p), ("controllen", ctypes.c_size_t),
                ("flags", ctypes.c_int)]


class _MMsgHdr(ctypes.Structure):
    _fields_ = [("hdr", _MsgHdr), ("len", ctypes.c_uint)]


def _libc_sendmmsg():  # noqa: ANN202
    if not _KERNEL_ABI_OK:
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).sendmmsg
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.POINTER(_MMsgHdr), ctypes.c_uint, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


_SENDMMSG = _libc_sendmmsg()


def _sockaddr(family: int, address: tuple) -> bytes:
    """struct sockaddr_in / sockaddr_in6 for a Python socket address."""
    host = address[0].split("%", 1)[0]
    if family == socket.AF_INET:
        return struct.pack("=H", family) + struct.pack(">H4s8x", address[1], socket.inet_pton(family, host))
    flowinfo, scope_id = (address[2], address[3]) if len(address) >= 4 else (0, 0)
    return (struct.pack("=H", family) + struct.pack(">HI16s", address[1], flowinfo, socket.inet_pton(family, host))
            + struct.pack("=I", scope_id))


class TimestampingError(OSError):
    """Timestamping that was asked for cannot be had (e.g. hardware mode on a NIC without it)."""


@dataclass(frozen=True)
class NicTimestamping:
    """What ETHTOOL_GET_TS_INFO says an interface can timestamp."""

    interface: str
    so_timestamping: int     # SOF_TIMESTAMPING_* capability bits
    phc_index: int           # PTP hardware clock, -1 if none
    tx_types: int
    rx_filters: int

    @property
    def hardware(self) -> bool:
        need = SOF_TIMESTAMPING_TX_HARDWARE | SOF_TIMESTAMPING_RX_HARDWARE | SOF_TIMESTAMPING_RAW_HARDWARE
        return self.so_timestamping & need == need and self.phc_index >= 0

    @property
    def software_tx(self) -> bool:
        return bool(self.so_timestamping & SOF_TIMESTAMPING_TX_SOFTWARE)

    def describe(self) -> str:
        names = ((SOF_TIMESTAMPING_TX_HARDWARE, "tx-hw"), (SOF_TIMESTAMPING_TX_SOFTWARE, "tx-sw"),
                 (SOF_TIMESTAMPING_RX_HARDWARE, "rx-hw"), (SOF_TIMESTAMPING_RX_SOFTWARE, "rx-sw"),
                 (SOF_TIMESTAMPING_RAW_HARDWARE, "raw-hw"))
        kinds = [name for bit, name in names if self.so_timestamping & bit]
        return f"{self.interface}: {','.join(kinds) or 'none'} phc={self.phc_index}"


def nic_timestamping(interface: str) -> NicTimestamping | None:
    """The interface's timestamping capabilities (SIOCETHTOOL ETHTOOL_GET_TS_INFO), None if it cannot be asked."""
    if not _KERNEL_ABI_OK or not interface or len(interface.encode()) >= 16:
        return None
    buf = array.array("B", _TS_INFO.pack(ETHTOOL_GET_TS_INFO, 0, -1, 0, 0, 0, 0, 0, 0, 0, 0))
    ifreq = struct.pack("16sP", interface.encode(), buf.buffer_info()[0])
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            fcntl.ioctl(s.fileno(), SIOCETHTOOL, ifreq)
    except OSError as exc:
        log.debug("ETHTOOL_GET_TS_INFO on %s failed: %s", interface, exc)
        return None
    _, caps, phc, tx_types, *_rest = _TS_INFO.unpack(buf.tobytes())
    return NicTimestamping(interface, caps, phc, tx_types, _rest[3])


def _enable_nic_hardware_timestamps(sock: socket.socket, interface: str) -> None:
    """Turn on TX and all-RX hardware timestamping on the NIC (SIOCSHWTSTAMP, needs CAP_NET_ADMIN) unless on."""
    def ioctl(request: int, config: tuple[int, int, int]) -> tuple[int, int, int]:
        buf = array.array("B", _HWTSTAMP_CONFIG.pack(*config))
        fcntl.ioctl(sock.fileno(), request, struct.pack("16sP", interface.encode(), buf.buffer_info()[0]))
        return _HWTSTAMP_CONFIG.unpack(buf.tobytes())

    try:
        _, tx_type, rx_filter = ioctl(SIOCGHWTSTAMP, (0, 0, 0))
        if tx_type == HWTSTAMP_TX_ON and rx_filter == HWTSTAMP_FILTER_ALL:
            return
    except OSError:
        pass
    try:
        ioctl(SIOCSHWTSTAMP, (0, HWTSTAMP_TX_ON, HWTSTAMP_FILTER_ALL))
    except OSError as exc:
        raise TimestampingError(exc.errno, f"cannot enable hardware timestamping on {interface}: "
                                           f"{exc.strerror} (SIOCSHWTSTAMP needs CAP_NET_ADMIN)") from None


@dataclass(frozen=True)
class TimestampingModes:
    """Which timestamps a TimestampedSocket delivers."""

    rx: RxMode
    tx: TxMode
    tx_match: TxMatch
    nic: NicTimestamping | None = None

    @property
    def kernel(self) -> bool:
        return self.rx != "userspace" and self.tx != "userspace"

    def as_dict(self) -> dict[str, object]:
        return {"rx": self.rx, "tx": self.tx, "tx_match": self.tx_match,
                "nic": self.nic.describe() if self.nic else None}


def timespec_ns(data: bytes, offset: int = 0) -> int:
    sec, nsec = _TIMESPEC.unpack_from(data, offset)
    return sec * 1_000_000_000 + nsec


def rx_timestamp(ancdata: list[tuple[int, int, bytes]], hardware: bool) -> int | None:
    """The kernel receive timestamp in a recvmsg's control messages, or None (0 means 'not taken')."""
    for level, kind, data in ancdata:
        if level != socket.SOL_SOCKET:
            continue
        if kind == SCM_TIMESTAMPING and len(data) >= _SCM_TIMESTAMPING.size:
            ns = timespec_ns(data, 32 if hardware else 0)
            return ns or None
        if kind == SCM_TIMESTAMPNS and len(data) >= _TIMESPEC.size:
            return timespec_ns(data) or None
    return None


def tx_timestamp(ancdata: list[tuple[int, int, bytes]], hardware: bool) -> tuple[int, int] | None:
    """(OPT_ID key, ns) of one MSG_ERRQUEUE message if it is a TX-completion timestamp, else None."""
    ns = key = None
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == SCM_TIMESTAMPING and len(data) >= _SCM_TIMESTAMPING.size:
            ns = timespec_ns(data, 32 if hardware else 0)
        elif ((level, kind) in ((socket.IPPROTO_IP, IP_RECVERR), (socket.IPPROTO_IPV6, IPV6_RECVERR))
              and len(data) >= _EXTENDED_ERR.size):
            ee_errno, origin, _type, _code, _pad, info, data_key = _EXTENDED_ERR.unpack_from(data)
            if ee_errno == errno.ENOMSG and origin == SO_EE_ORIGIN_TIMESTAMPING and info == SCM_TSTAMP_SND:
                key = data_key
    if ns and key is not None:
        return key, ns
    return None


class TimestampedSocket:
    """One bound, non-blocking UDP socket whose sends and receives carry kernel timestamps."""

    def __init__(self, address: tuple, family: int = socket.AF_INET, mode: Mode = "software",
                 interface: str | None = None) -> None:
        if mode not in ("software", "hardware", "auto"):
            raise ValueError(f"timestamping mode must be software, hardware or auto, got {mode!r}")
        nic = nic_timestamping(interface) if interface else None
        hardware = mode == "hardware" or (mode == "auto" and nic is not None and nic.hardware)
        if hardware and (nic is None or not nic.hardware):
            raise TimestampingError(errno.EOPNOTSUPP, f"hardware timestamping asked for, but "
                                    f"{nic.describe() if nic else f'interface {interface!r} reports no capabilities'}")
        self.sock = socket.socket(family, socket.SOCK_DGRAM)
        try:
            self.sock.bind(address)
            self.sock.setblocking(False)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
            if hardware:
                assert interface is not None
                _enable_nic_hardware_timestamps(self.sock, interface)
            self.modes = self._configure(hardware, nic)
        except BaseException:
            self.sock.close()
            raise
        self._hardware = hardware
        self._next_key = 0
        self._opt_id_cmsg_known = False   # True once a send with SCM_TS_OPT_ID succeeded
        log.info("clock-probe socket %s: rx=%s tx=%s (%s)", self.sock.getsockname(), self.modes.rx,
                 self.modes.tx, self.modes.tx_match)

    def _configure(self, hardware: bool, nic: NicTimestamping | None) -> TimestampingModes:
        if not _KERNEL_ABI_OK:
            return TimestampingModes("userspace", "userspace", "none", nic)
        if hardware:
            flags = SOF_TIMESTAMPING_RX_HARDWARE | SOF_TIMESTAMPING_TX_HARDWARE | SOF_TIMESTAMPING_RAW_HARDWARE
        else:
            flags = SOF_TIMESTAMPING_RX_SOFTWARE | SOF_TIMESTAMPING_TX_SOFTWARE | SOF_TIMESTAMPING_SOFTWARE
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING,
                                 flags | SOF_TIMESTAMPING_OPT_ID | SOF_TIMESTAMPING_OPT_TSONLY)
            kind: TxMode = "hardware" if hardware else "software"
            return TimestampingModes(kind, kind, "scm_ts_opt_id", nic)  # downgraded to the counter on first send
        except OSError as exc:
            if hardware:
                raise TimestampingError(exc.errno, f"SO_TIMESTAMPING (hardware) refused: {exc.strerror}") from None
            log.warning("SO_TIMESTAMPING refused (%s); trying SO_TIMESTAMPNS", exc)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            return TimestampingModes("timestampns", "userspace", "none", nic)
        except OSError as exc:
            log.warning("SO_TIMESTAMPNS refused (%s); using userspace timestamps", exc)
            return TimestampingModes("userspace", "userspace", "none", nic)

    # -- sending --------------------------------------------------------------------------------------------

    def send(self, payload: bytes, address: tuple) -> tuple[int | None, int]:
        """Send one datagram; returns (the key its TX timestamp will carry or None, CLOCK_REALTIME just before).

        Raises OSError when the kernel refuses the datagram (unreachable network, ...).
        """
        if self.modes.tx == "userspace":
            now = time.time_ns()
            self.sock.sendto(payload, address)
            return None, now
        key = self._next_key
        if self.modes.tx_match == "scm_ts_opt_id":
            now = time.time_ns()
            try:
                self.sock.sendmsg([payload], [(socket.SOL_SOCKET, SCM_TS_OPT_ID, _U32.pack(key))], 0, address)
                self._opt_id_cmsg_known = True
            except OSError as exc:
                if exc.errno != errno.EINVAL or self._opt_id_cmsg_known:
                    raise
                now = time.time_ns()
                self.sock.sendto(payload, address)  # raises again if the datagram itself was the problem
                self._downgrade_to_counter()
        else:
            now = time.time_ns()
            self.sock.sendto(payload, address)
        self._next_key = (key + 1) & 0xFFFFFFFF
        return key, now

    def send_pair(self, payloads: tuple[bytes, bytes], address: tuple) -> list[tuple[int | None, int] | OSError]:
        """Send two datagrams back to back with one sendmmsg call; per datagram what `send` returns, or its error.

        One system call leaves the scheduler no chance to run anything between the two, so the pair leaves
        as close together as the kernel allows. Without sendmmsg, two sends.
        """
        if _SENDMMSG is None or self.modes.tx == "userspace":   # userspace stamps need one clock read each
            return [self._send_or_error(p, address) for p in payloads]
        use_cmsg = self.modes.tx_match == "scm_ts_opt_id"
        first = self._next_key
        keys = [first, (first + 1) & 0xFFFFFFFF]
        name = ctypes.create_string_buffer(_sockaddr(self.sock.family, address))
        buffers = [ctypes.create_string_buffer(p, len(p)) for p in payloads]
        controls = [ctypes.create_string_buffer(_CMSG_U32.pack(socket.CMSG_LEN(4), socket.SOL_SOCKET, SCM_TS_OPT_ID, k))
                    for k in keys] if use_cmsg else []
        iovs = (_IoVec * 2)(*[_IoVec(ctypes.addressof(b), len(p)) for b, p in zip(buffers, payloads, strict=True)])
        msgs = (_MMsgHdr * 2)()
        for i in range(2):
            hdr = msgs[i].hdr
            hdr.name, hdr.namelen = ctypes.addressof(name), len(name) - 1
            hdr.iov, hdr.iovlen = ctypes.pointer(iovs[i]), 1
            if use_cmsg:
                hdr.control, hdr.controllen = ctypes.addressof(controls[i]), _CMSG_U32.size
        now = time.time_ns()
        sent = _SENDMMSG(self.sock.fileno(), msgs, 2, 0)
        if sent < 0:
            code = ctypes.get_errno()
            if code == errno.EINVAL and use_cmsg and not self._opt_id_cmsg_known:
                self._downgrade_to_counter()
                return self.send_pair(payloads, address)
            return [OSError(code, os.strerror(code))] * 2
        if use_cmsg:
            self._opt_id_cmsg_known = True
        self._next_key = (first + sent) & 0xFFFFFFFF
        results: list[tuple[int | None, int] | OSError] = [(keys[i], now) for i in range(sent)]
        results += [self._send_or_error(payloads[i], address) for i in range(sent, 2)]
        return results

    def _send_or_error(self, payload: bytes, address: tuple) -> tuple[int | None, int] | OSError:
        try:
            return self.send(payload, address)
        except OSError as exc:
            return exc

    def _downgrade_to_counter(self) -> None:
        # The kernel does not know SCM_TS_OPT_ID (before 6.13): its own counter numbers the sends.
        self.modes = TimestampingModes(self.modes.rx, self.modes.tx, "opt_id_counter", self.modes.nic)
        log.info("SCM_TS_OPT_ID unsupported; matching TX timestamps by the kernel's OPT_ID counter")

    def fall_back_to_userspace_tx(self) -> None:
        """The kernel is not returning TX timestamps (e.g. a driver that never calls skb_tx_timestamp)."""
        self.modes = TimestampingModes(self.modes.rx, "userspace", "none", self.modes.nic)

    def fall_back_to_userspace_rx(self) -> None:
        self.modes = TimestampingModes("userspace", self.modes.tx, self.modes.tx_match, self.modes.nic)

    # -- receiving ------------------------------------------------------------------------------------------

    def recv(self, bufsize: int = 2048) -> tuple[bytes, tuple, int | None] | None:
        """One datagram as (payload, sender address, receive ns or None if the kernel gave none); None if idle."""
        try:
            data, ancdata, _flags, address = self.sock.recvmsg(bufsize, _ANC_SPACE)
        except (BlockingIOError, InterruptedError):
            return None
        if self.modes.rx == "userspace":
            return data, address, time.time_ns()
        return data, address, rx_timestamp(ancdata, self._hardware)

    def recv_tx_timestamps(self, limit: int = 1024) -> list[tuple[int, int]]:
        """Drain up to `limit` messages from the error queue; returns their (key, TX ns) timestamps."""
        out: list[tuple[int, int]] = []
        for _ in range(limit):
            try:
                _data, ancdata, _flags, _address = self.sock.recvmsg(0, _ANC_SPACE, socket.MSG_ERRQUEUE)
            except (BlockingIOError, InterruptedError):
                break
            stamp = tx_timestamp(ancdata, self._hardware)
            if stamp is not None:
                out.append(stamp)
        return out

    def fileno(self) -> int:
        return self.sock.fileno()

    def getsockname(self) -> tuple:
        return self.sock.getsockname()

    def close(self) -> None:
        self.sock.close()
