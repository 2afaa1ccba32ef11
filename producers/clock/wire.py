"""The clock-probe wire format: authenticated probes, their two-step follow-ups and warm-ups (big-endian).

A sender sends the two probes of a pair back to back, then, once the kernel
has reported when each one actually left (the TX timestamp on the socket's
error queue), one FOLLOW_UP carrying those timestamps, as PTP's two-step
Follow_Up does. The receiver joins the follow-up with the receive timestamps
of the probes by (sender, pair_id). A probe itself can only carry the
userspace clock reading taken before sendto, kept for diagnostics.

Every datagram starts with one header and ends with a MAC:

  header     magic "CTCK" | version u8 = 2 | type u8 | name_len u8 | aux u8 | sent_ns i64 | sender name
  PROBE      header (type 1, aux = idx, sent_ns = tx_user_ns) | pair_id u64 | mac
  FOLLOW_UP  header (type 2, aux = tx_source) | count u16 | count x (pair_id u64 | tx0_ns i64 | tx1_ns i64
             | valid u8) | mac
  WARM_UP    header (type 3, aux = 0) | mac   (sent just before a pair; the receiver only counts it)
  mac        keyed BLAKE2b with a 16-byte digest (personalised "clocktower-ck2") over every byte before it;
             the cluster key is used as is when it is at most 64 bytes, else its BLAKE2b-512 hash is

The MAC covers the sender name, the pair ids and `sent_ns`, a per-sender stamp
that only grows (see `replay`), so a datagram can neither be forged without
the key nor replayed. `decode` checks the MAC before it parses anything else
(AuthError), then checks everything else (WireError). `valid` bit i says
whether probe i's TX timestamp is known; `tx_source` says how the sender took
its TX timestamps. A probe from a 6-character node name is 46 bytes. Keyed BLAKE2b is a MAC in one
pass (RFC 7693); here it costs about a third of HMAC-SHA256, which matters because the second probe
of a pair is encoded while the first is already on its way.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from dataclasses import dataclass

MAGIC = b"CTCK"
VERSION = 2
TYPE_PROBE = 1
TYPE_FOLLOW_UP = 2
TYPE_WARM_UP = 3
MAC_BYTES = 16
_PERSON = b"clocktower-ck2"
MAX_NAME_BYTES = 255
MAX_FOLLOW_UP_ENTRIES = 46           # 16 + 255 + 2 + 46 x 25 + 16 = 1439 bytes: one datagram on a 1500 MTU, v4 or v6

TX_SOURCE_SOFTWARE = 0               # kernel software TX timestamp (SO_TIMESTAMPING, error queue)
TX_SOURCE_HARDWARE = 1               # NIC hardware TX timestamp
TX_SOURCE_USERSPACE = 2              # clock_gettime(CLOCK_REALTIME) just before sendto
TX_SOURCES = {"software": TX_SOURCE_SOFTWARE, "hardware": TX_SOURCE_HARDWARE, "userspace": TX_SOURCE_USERSPACE}

_HEADER = struct.Struct(">4sBBBBq")
_PAIR = struct.Struct(">Q")
_COUNT = struct.Struct(">H")
_ENTRY = struct.Struct(">QqqB")
_I64_MAX = 2**63 - 1


class WireError(ValueError):
    """A datagram that is not a well-formed clock probe or follow-up; the message says what is wrong."""


class AuthError(WireError):
    """A datagram whose MAC does not verify with our key: not from a key holder, or altered on the way."""


@dataclass(frozen=True, slots=True)
class Probe:
    sender: str
    pair_id: int
    idx: int
    tx_user_ns: int                  # also the datagram's sent_ns stamp

    @property
    def sent_ns(self) -> int:
        return self.tx_user_ns


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
    sent_ns: int


@dataclass(frozen=True, slots=True)
class WarmUp:
    """Primes the send and receive paths just before a pair, so probe 0 does not run them cold."""

    sender: str
    sent_ns: int


Message = Probe | FollowUp | WarmUp


def mac(key: bytes, data: bytes) -> bytes:
    """The 16-byte tag of `data` under `key`."""
    if len(key) > hashlib.blake2b.MAX_KEY_SIZE:
        key = hashlib.blake2b(key, person=_PERSON).digest()
    return hashlib.blake2b(data, key=key, digest_size=MAC_BYTES, person=_PERSON).digest()


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


def _seal(key: bytes, kind: int, aux: int, sender: str, sent_ns: int, body: bytes) -> bytes:
    name = _name_bytes(sender)
    _check_ns(sent_ns, "sent_ns")
    data = _HEADER.pack(MAGIC, VERSION, kind, len(name), aux, sent_ns) + name + body
    return data + mac(key, data)


def encode_probe(probe: Probe, key: bytes) -> bytes:
    if probe.idx not in (0, 1):
        raise ValueError(f"probe idx must be 0 or 1, got {probe.idx}")
    _check_u64(probe.pair_id, "pair_id")
    return _seal(key, TYPE_PROBE, probe.idx, probe.sender, probe.tx_user_ns, _PAIR.pack(probe.pair_id))


def encode_follow_up(follow_up: FollowUp, key: bytes) -> bytes:
    entries = follow_up.entries
    if not 1 <= len(entries) <= MAX_FOLLOW_UP_ENTRIES:
        raise ValueError(f"a follow-up carries 1..{MAX_FOLLOW_UP_ENTRIES} entries, got {len(entries)}")
    if follow_up.tx_source not in TX_SOURCES.values():
        raise ValueError(f"unknown tx_source {follow_up.tx_source}")
    parts = [_COUNT.pack(len(entries))]
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
    return _seal(key, TYPE_FOLLOW_UP, follow_up.tx_source, follow_up.sender, follow_up.sent_ns, b"".join(parts))


def encode_warm_up(warm_up: WarmUp, key: bytes) -> bytes:
    return _seal(key, TYPE_WARM_UP, 0, warm_up.sender, warm_up.sent_ns, b"")


def _decode_name(data: bytes, start: int, length: int) -> str:
    if length == 0:
        raise WireError("empty sender name")
    try:
        return data[start:start + length].decode("utf-8")
    except UnicodeDecodeError:
        raise WireError("sender name is not UTF-8") from None


def _follow_up_entries(body: bytes) -> tuple[FollowUpEntry, ...]:
    if len(body) < _COUNT.size:
        raise WireError("follow-up without an entry count")
    (count,) = _COUNT.unpack_from(body)
    if len(body) != _COUNT.size + count * _ENTRY.size:
        raise WireError(f"follow-up body is {len(body)} bytes, its count says {_COUNT.size + count * _ENTRY.size}")
    if not 1 <= count <= MAX_FOLLOW_UP_ENTRIES:
        raise WireError(f"follow-up with {count} entries")
    entries = []
    for offset in range(_COUNT.size, len(body), _ENTRY.size):
        pair_id, tx0, tx1, valid = _ENTRY.unpack_from(body, offset)
        if valid == 0 or valid > 3:
            raise WireError(f"follow-up entry with valid mask {valid}")
        if (valid & 1 and tx0 < 0) or (valid & 2 and tx1 < 0):
            raise WireError("negative TX timestamp")
        entries.append(FollowUpEntry(pair_id, tx0 if valid & 1 else None, tx1 if valid & 2 else None))
    return tuple(entries)


def decode(data: bytes, key: bytes) -> Message:
    """Verify and parse one datagram; AuthError if its MAC is wrong, WireError for any other defect."""
    if len(data) < _HEADER.size + MAC_BYTES:
        raise WireError(f"datagram of {len(data)} bytes is too short")
    if data[:4] != MAGIC:
        raise WireError("bad magic")
    if data[4] != VERSION:
        raise WireError(f"unsupported version {data[4]}")
    signed, tag = data[:-MAC_BYTES], data[-MAC_BYTES:]
    if not hmac.compare_digest(mac(key, signed), tag):
        raise AuthError("bad MAC: not signed with this cluster's clock key")
    _, _, kind, name_len, aux, sent_ns = _HEADER.unpack_from(signed)
    if len(signed) < _HEADER.size + name_len:
        raise WireError(f"datagram is {len(data)} bytes, its name length says more")
    sender = _decode_name(signed, _HEADER.size, name_len)
    if sent_ns < 0:
        raise WireError("negative sent_ns")
    body = signed[_HEADER.size + name_len:]
    if kind == TYPE_PROBE:
        if len(body) != _PAIR.size:
            raise WireError(f"probe body is {len(body)} bytes, expected {_PAIR.size}")
        if aux not in (0, 1):
            raise WireError(f"probe idx {aux} is not 0 or 1")
        return Probe(sender, _PAIR.unpack(body)[0], aux, sent_ns)
    if kind == TYPE_FOLLOW_UP:
        if aux not in TX_SOURCES.values():
            raise WireError(f"unknown tx_source {aux}")
        return FollowUp(sender, aux, _follow_up_entries(body), sent_ns)
    if kind == TYPE_WARM_UP:
        if body:
            raise WireError(f"warm-up with a {len(body)}-byte body")
        return WarmUp(sender, sent_ns)
    raise WireError(f"unknown message type {kind}")
