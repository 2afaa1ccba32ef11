"""The clock-probe wire format: probes and their two-step follow-ups (big-endian, struct).

A sender sends the two probes of a pair back to back, then, once the kernel
has reported when each one actually left (the TX timestamp on the socket's
error queue), one FOLLOW_UP carrying those timestamps, as PTP's two-step
Follow_Up does. The receiver joins the follow-up with the receive timestamps
of the probes by (sender, pair_id). A probe itself can only carry the
userspace clock reading taken before sendto, kept for diagnostics.

  PROBE      magic "CTCK" | version u8 | type u8 = 1 | idx u8 | name_len u8 | pair_id u64 | tx_user_ns i64
             | sender name (UTF-8, name_len bytes)
  FOLLOW_UP  magic "CTCK" | version u8 | type u8 = 2 | tx_source u8 | name_len u8 | count u16
             | sender name | count x (pair_id u64 | tx0_ns i64 | tx1_ns i64 | valid u8)
  WARM_UP    magic "CTCK" | version u8 | type u8 = 3   (sent just before a pair, ignored by the receiver)

`valid` bit i says whether probe i's TX timestamp is known (a probe whose
send failed or whose timestamp never came is left out). `tx_source` says how
the sender took its TX timestamps. Everything is checked on decode, and any
defect raises WireError.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

MAGIC = b"CTCK"
VERSION = 1
TYPE_PROBE = 1
TYPE_FOLLOW_UP = 2
TYPE_WARM_UP = 3
MAX_NAME_BYTES = 255
MAX_FOLLOW_UP_ENTRIES = 48           # 10 + 255 + 48 x 25 = 1465 bytes: fits one 1500-byte MTU datagram

TX_SOURCE_SOFTWARE = 0               # kernel software TX timestamp (SO_TIMESTAMPING, error queue)
TX_SOURCE_HARDWARE = 1               # NIC hardware TX timestamp
TX_SOURCE_USERSPACE = 2              # clock_gettime(CLOCK_REALTIME) just before sendto
TX_SOURCES = {"software": TX_SOURCE_SOFTWARE, "hardware": TX_SOURCE_HARDWARE, "userspace": TX_SOURCE_USERSPACE}

_PROBE = struct.Struct(">4sBBBBQq")
_FOLLOW_UP = struct.Struct(">4sBBBBH")
_ENTRY = struct.Struct(">QqqB")
_I64_MAX = 2**63 - 1


class WireError(ValueError):
    """A datagram that is not a well-formed clock probe or follow-up; the message says what is wrong."""


@dataclass(frozen=True, slots=True)
class Probe:
    sender: str
    pair_id: int
    idx: int
    tx_user_ns: int


@dataclass(frozen=True, slots=True)
class FollowUpEntry:
    pair_id: int
    tx0_ns: int | None
    tx1_ns: int | None

    def tx(self, idx: int) -> int | None:
        return self.tx0_ns if idx == 0 else self.tx1_ns


@dataclass(frozen=True, slots=True)
class FollowUp:
    sender: str
    tx_source: int
    entries: tuple[FollowUpEntry, ...]


@dataclass(frozen=True, slots=True)
class WarmUp:
    """Primes the send and receive paths just before a pair, so probe 0 does not run them cold."""


WARM_UP_BYTES = MAGIC + bytes((VERSION, TYPE_WARM_UP))


def _name_bytes(name: str) -> bytes:
    raw = name.encode("utf-8")
    if not 1 <= len(raw) <= MAX_NAME_BYTES:
        raise ValueError(f"sender name must be 1..{MAX_NAME_BYTES} UTF-8 bytes, got {len(raw)}")
    return raw


def _check_u64(value: int, what: str) -> None:
    if not 0 <= value < 2**64:
        raise ValueError(f"{what} must fit in 64 unsigned bits, got {value}")


def _check_ns(value: int, what: str) -> None:
    if not 0 <= value <= _I64_MAX:
        raise ValueError(f"{what} must be a non-negative int64, got {value}")


def encode_probe(probe: Probe) -> bytes:
    name = _name_bytes(probe.sender)
    if probe.idx not in (0, 1):
        raise ValueError(f"probe idx must be 0 or 1, got {probe.idx}")
    _check_u64(probe.pair_id, "pair_id")
    _check_ns(probe.tx_user_ns, "tx_user_ns")
    return _PROBE.pack(MAGIC, VERSION, TYPE_PROBE, probe.idx, len(name), probe.pair_id, probe.tx_user_ns) + name


def encode_follow_up(follow_up: FollowUp) -> bytes:
    name = _name_bytes(follow_up.sender)
    entries = follow_up.entries
    if not 1 <= len(entries) <= MAX_FOLLOW_UP_ENTRIES:
        raise ValueError(f"a follow-up carries 1..{MAX_FOLLOW_UP_ENTRIES} entries, got {len(entries)}")
    if follow_up.tx_source not in TX_SOURCES.values():
        raise ValueError(f"unknown tx_source {follow_up.tx_source}")
    parts = [_FOLLOW_UP.pack(MAGIC, VERSION, TYPE_FOLLOW_UP, follow_up.tx_source, len(name), len(entries)), name]
    for e in entries:
        _check_u64(e.pair_id, "pair_id")
        valid = 0
        for bit, ts in enumerate((e.tx0_ns, e.tx1_ns)):
            if ts is not None:
                _check_ns(ts, f"tx{bit}_ns")
                valid |= 1 << bit
        if not valid:
            raise ValueError(f"follow-up entry for pair {e.pair_id} has no TX timestamp")
        parts.append(_ENTRY.pack(e.pair_id, e.tx0_ns or 0, e.tx1_ns or 0, valid))
    return b"".join(parts)


def _decode_name(data: bytes, start: int, length: int) -> str:
    if length == 0:
        raise WireError("empty sender name")
    try:
        return data[start:start + length].decode("utf-8")
    except UnicodeDecodeError:
        raise WireError("sender name is not UTF-8") from None


def decode(data: bytes) -> Probe | FollowUp | WarmUp:
    """Parse one datagram; raises WireError saying what is wrong with it."""
    if len(data) < 6:
        raise WireError(f"datagram of {len(data)} bytes is too short")
    if data[:4] != MAGIC:
        raise WireError("bad magic")
    if data[4] != VERSION:
        raise WireError(f"unsupported version {data[4]}")
    kind = data[5]
    if kind == TYPE_PROBE:
        if len(data) < _PROBE.size:
            raise WireError(f"probe of {len(data)} bytes is too short")
        _, _, _, idx, name_len, pair_id, tx_user_ns = _PROBE.unpack_from(data)
        if len(data) != _PROBE.size + name_len:
            raise WireError(f"probe is {len(data)} bytes, its header says {_PROBE.size + name_len}")
        if idx not in (0, 1):
            raise WireError(f"probe idx {idx} is not 0 or 1")
        if tx_user_ns < 0:
            raise WireError("negative tx_user_ns")
        return Probe(_decode_name(data, _PROBE.size, name_len), pair_id, idx, tx_user_ns)
    if kind == TYPE_FOLLOW_UP:
        if len(data) < _FOLLOW_UP.size:
            raise WireError(f"follow-up of {len(data)} bytes is too short")
        _, _, _, tx_source, name_len, count = _FOLLOW_UP.unpack_from(data)
        expected = _FOLLOW_UP.size + name_len + count * _ENTRY.size
        if len(data) != expected:
            raise WireError(f"follow-up is {len(data)} bytes, its header says {expected}")
        if not 1 <= count <= MAX_FOLLOW_UP_ENTRIES:
            raise WireError(f"follow-up with {count} entries")
        if tx_source not in TX_SOURCES.values():
            raise WireError(f"unknown tx_source {tx_source}")
        sender = _decode_name(data, _FOLLOW_UP.size, name_len)
        entries = []
        for offset in range(_FOLLOW_UP.size + name_len, len(data), _ENTRY.size):
            pair_id, tx0, tx1, valid = _ENTRY.unpack_from(data, offset)
            if valid == 0 or valid > 3:
                raise WireError(f"follow-up entry with valid mask {valid}")
            if (valid & 1 and tx0 < 0) or (valid & 2 and tx1 < 0):
                raise WireError("negative TX timestamp")
            entries.append(FollowUpEntry(pair_id, tx0 if valid & 1 else None, tx1 if valid & 2 else None))
        return FollowUp(sender, tx_source, tuple(entries))
    if kind == TYPE_WARM_UP:
        if len(data) != len(WARM_UP_BYTES):
            raise WireError(f"warm-up of {len(data)} bytes, expected {len(WARM_UP_BYTES)}")
        return WarmUp()
    raise WireError(f"unknown message type {kind}")
