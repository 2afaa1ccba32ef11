"""What the BCC-based sources share: finding kernel headers, checking the machine, compiling, draining.

BCC (Debian's python3-bpfcc) is imported lazily, so this package imports on any machine; `check()`
says what is missing. `clocktower agent setup-ebpf` (setup_bcc.sh, beside this file) makes a Debian machine ready.

Draining: the BPF programs count per (flow, time slot) into two maps written alternately (DoubleBuffer);
the drain thread reads the idle map every drain period, and SlotAggregator merges the entries of a slot
that straddles a flip and holds them until the slot is complete, so one slot of one flow is emitted once.
WallClock turns the slots' CLOCK_MONOTONIC times into wall-clock timestamps.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import ipaddress
import logging
import math
import os
import struct
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from clocktower.producers.event_builder import EventBuilder
from clocktower.runtime.bcc_build import (  # noqa: F401 - re-exported to the agent's sources
    SETUP_HINT,
    bcc_problem,
    compile_bpf,
    find_kernel_source,
)
from clocktower.schemas.telemetry import FlowCounters

TRACEFS = Path("/sys/kernel/tracing")
SETUP_SCRIPT = Path(__file__).with_name("setup_bcc.sh")   # package data: `clocktower agent setup-ebpf` runs it

CAP_NET_ADMIN = 12
CAP_SYS_ADMIN = 21
CAP_PERFMON = 38
CAP_BPF = 39

log = logging.getLogger(__name__)

PROTO = {6: "tcp", 17: "udp"}
# Kernel counters are valid by construction (u16 ports, u64 counts, formatted addresses): the flow and tc
# drains build events without pydantic validation, which was a tenth of the drain thread's CPU.
build_flow_counters = EventBuilder(FlowCounters)


def effective_caps() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    except OSError:
        pass
    return 0


def privilege_problem(need_net_admin: bool = False) -> str | None:
    caps = effective_caps()
    has = lambda cap: bool(caps >> cap & 1)  # noqa: E731
    if not (has(CAP_SYS_ADMIN) or (has(CAP_BPF) and has(CAP_PERFMON))):
        return "loading BPF programs needs root (or CAP_BPF and CAP_PERFMON)"
    if need_net_admin and not has(CAP_NET_ADMIN):
        return "attaching tc classifiers needs CAP_NET_ADMIN"
    return None


def tracepoints_problem(tracepoints: Iterable[str]) -> str | None:
    events = TRACEFS / "events"
    if not events.is_dir() and not Path("/sys/kernel/debug/tracing/events").is_dir():
        return f"tracefs is not mounted (mount -t tracefs tracefs {TRACEFS}; {SETUP_HINT})"
    base = events if events.is_dir() else Path("/sys/kernel/debug/tracing/events")
    missing = [tp for tp in tracepoints if not (base / tp.replace(":", "/") / "format").is_file()]
    if missing:
        return f"this kernel lacks the tracepoints {', '.join(missing)}"
    return None


class DoubleBuffer:
    """Two BPF hash maps written alternately, chosen by `sel[0]`; a drain reads the idle one, then flips.

    Each drain reads (and deletes) the map the programs stopped writing at the previous drain, a whole
    period ago: programs that read the old selector finish within microseconds (they run with
    preemption or BH disabled), so every increment lands in exactly one drain, and the drain thread
    wakes once per period (a grace sleep after each flip cost more CPU than the drain itself). Counts
    therefore reach the drain one period late. `dirty[i]` tells whether map i got anything at all.
    """

    def __init__(self, bpf: Any, names: tuple[str, str]) -> None:
        self.key_type, self.leaf_type = bpf[names[0].encode()].Key, bpf[names[0].encode()].Leaf
        self.sel = bpf[b"sel"]
        self.dirty = bpf[b"dirty"]
        self.maps = (BatchDrainer(bpf[names[0].encode()]), BatchDrainer(bpf[names[1].encode()]))
        self.active = 0
        self.flipped_ns = time.monotonic_ns()            # CLOCK_MONOTONIC just before the last flip
        self.sel[ctypes.c_int(0)] = ctypes.c_uint32(0)

    def flip_and_read(self) -> tuple[list[tuple[bytes, bytes]], int]:
        """The idle map's entries, and the monotonic time before which it got all its counts.

        That time is taken just before the flip that made the map idle: the programs read the clock after
        the selector, so every count in the other map has a slot at or after that time's slot.
        """
        idle = 1 - self.active                           # written until the previous drain, a period ago
        items: list[tuple[bytes, bytes]] = []
        if self.dirty[ctypes.c_int(idle)].value:         # skip the bucket walk of a map nothing touched
            drainer = self.maps[idle]
            drainer.incomplete = False
            items = drainer.drain()          # raises only if nothing was read: no flip, the next drain retries
            if drainer.incomplete:           # partly read: keep it dirty and idle, read the rest next time
                return items, self.flipped_ns
            self.dirty[ctypes.c_int(idle)] = ctypes.c_uint64(0)
        settled_ns, self.flipped_ns = self.flipped_ns, time.monotonic_ns()
        self.active = idle
        self.sel[ctypes.c_int(0)] = ctypes.c_uint32(idle)
        return items, settled_ns

    def read_all(self) -> list[tuple[bytes, bytes]]:
        """Both maps, for the final drain after the programs are detached (dirty or not)."""
        return self.maps[0].drain() + self.maps[1].drain()


def slot_map_entries(max_flows: int, drain_ms: float, slot_ms: float) -> int:
    """Entries of one (flow, slot) counter map that holds `max_flows` flows for a drain period.

    A map is written for one drain period, which touches ceil(drain / slot) + 1 slots; one more spare
    slot covers a drain that runs late.
    """
    return max_flows * (math.ceil(drain_ms / slot_ms - 1e-9) + 2)


class SlotAggregator:
    """Counters keyed by (flow, slot) out of a DoubleBuffer, merged and held until their slot is complete.

    A slot current at a flip gets counts in both maps, which two drains read a period apart: its
    entries are summed here, and a (flow, slot) is returned once, when every map that could hold it has
    been read. Entries are raw bytes (BatchDrainer): the key, whose u64 `slot` field is part of the
    identity, and the value, whose u64 `fields` are summed.
    """

    # Slots that end this long before a flip are complete; the margin covers the programs' clock reads
    # racing the flip (microseconds), at worst delaying a slot by one drain.
    MARGIN_NS = 100_000

    def __init__(self, slot_ns: int, key_type: Any, leaf_type: Any, fields: tuple[str, ...]) -> None:
        self.slot_ns = slot_ns
        self.key_type = key_type
        self.slot_at = key_type.slot.offset
        self._slot = struct.Struct("=Q")
        layout, at = "=", 0
        for f in sorted(fields, key=lambda f: getattr(leaf_type, f).offset):
            desc = getattr(leaf_type, f)
            if desc.size != 8:
                raise TypeError(f"{leaf_type.__name__}.{f} is not a u64")
            layout += "x" * (desc.offset - at) + "Q"
            at = desc.offset + 8
        self._value = struct.Struct(layout)
        self._order = [sorted(fields, key=lambda f: getattr(leaf_type, f).offset).index(f) for f in fields]
        self.pending: dict[bytes, list[int]] = {}
        self.merged = 0                                  # entries added to a held slot (a stat)

    def add(self, items: list[tuple[bytes, bytes]], settled_ns: int | None) -> list[tuple[bytes, int, list[int]]]:
        """Merge `items`; return (flow, slot, sums) of every held slot that ends before `settled_ns` (None: all).

        `flow` is the key's bytes without the slot (see `key()`); sums are in the order of `fields`.
        """
        pending, unpack = self.pending, self._value.unpack
        for k, v in items:
            held = pending.get(k)
            if held is None:
                pending[k] = list(unpack(v))
            else:
                self.merged += 1
                for i, n in enumerate(unpack(v)):
                    held[i] += n
        slot_of, at = self._slot.unpack_from, self.slot_at
        if settled_ns is None:
            done = list(pending)
        else:
            open_slot = (settled_ns - self.MARGIN_NS) // self.slot_ns   # may still get counts in the other map
            done = [k for k in pending if slot_of(k, at)[0] < open_slot]
        order = self._order
        out = []
        for k in done:
            sums = pending.pop(k)
            out.append((k[:at] + k[at + 8:], slot_of(k, at)[0], [sums[i] for i in order]))
        return out

    def key(self, flow: bytes) -> Any:
        """The key structure of a `flow` from add() (slot 0)."""
        at = self.slot_at
        return self.key_type.from_buffer_copy(flow[:at] + bytes(8) + flow[at:])


class WallClock:
    """The offset that turns CLOCK_MONOTONIC (bpf_ktime_get_ns) into the wall clock.

    The offset changes only when the wall clock is stepped (NTP slews both clocks alike), but one reading is
    off by the time between its clock reads: ~100 ns, far more if the thread is preempted between them.
    `offset()` measures again and keeps the previous value unless it moved by more than `step_ns`, so slots
    of one flow stay exact multiples of the slot length apart on the wall clock too.
    """

    def __init__(self, step_ns: int = 1_000_000) -> None:
        self.step_ns = step_ns
        self._offset: int | None = None

    def offset(self) -> int:
        for _ in range(3):
            before = time.monotonic_ns()
            wall = time.time_ns()
            after = time.monotonic_ns()
            if after - before < 50_000:                  # not preempted in between
                sample = wall - (before + after) // 2
                if self._offset is None or abs(sample - self._offset) > self.step_ns:
                    self._offset = sample
                break
        if self._offset is None:
            self._offset = time.time_ns() - time.monotonic_ns()
        return self._offset


class BatchDrainer:
    """Reads and deletes every entry of a BPF hash map with BPF_MAP_LOOKUP_AND_DELETE_BATCH, `chunk` at a time.

    BCC's `items_lookup_and_delete_batch()` allocates key and value buffers for the map's max_entries on
    every call (MBs for a 64k-entry map): at 100 drains/s that alone cost ~7 % of a core on an idle node.
    The buffers here are allocated once, and an empty map costs one syscall. Entries come back as raw
    (key, value) bytes: copying each into ctypes structures cost more than the syscall.
    """

    def __init__(self, table: Any, chunk: int = 1024) -> None:
        from bcc.libbcc import lib  # imported here: bcc is optional until a source starts

        self.table = table
        self._batch = lib.bpf_lookup_and_delete_batch
        self.chunk = chunk
        self.incomplete = False      # the last drain stopped on an error after reading some entries
        self.keys = (table.Key * chunk)()
        self.values = (table.Leaf * chunk)()
        self.key_size, self.value_size = ctypes.sizeof(table.Key), ctypes.sizeof(table.Leaf)
        self.batch_api = True

    def drain(self) -> list[tuple[bytes, bytes]]:
        if not self.batch_api:
            return _read_and_delete_one_by_one(self.table)
        out: list[tuple[bytes, bytes]] = []
        ks, vs = self.key_size, self.value_size
        token = ctypes.c_uint32(0)
        first = True
        while True:
            count = ctypes.c_uint32(self.chunk)
            res = self._batch(self.table.map_fd, None if first else ctypes.byref(token), ctypes.byref(token),
                              ctypes.byref(self.keys), ctypes.byref(self.values), ctypes.byref(count))
            err = ctypes.get_errno() if res != 0 else 0
            if n := count.value:
                keys, values = ctypes.string_at(self.keys, n * ks), ctypes.string_at(self.values, n * vs)
                out += [(keys[i * ks:(i + 1) * ks], values[i * vs:(i + 1) * vs]) for i in range(n)]
            if res == 0:
                first = False
                continue
            if err == errno.ENOENT:            # the whole map was read
                return out
            if err in (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP) and first and not out:
                self.batch_api = False         # a kernel without batch ops on this map type
                return _read_and_delete_one_by_one(self.table)
            if err == errno.ENOSPC and count.value == 0:   # a bucket larger than the chunk: fall back now
                return out + _read_and_delete_one_by_one(self.table)
            if out:   # what was read is already deleted from the map: hand it over; the caller retries the rest
                log.warning("BPF_MAP_LOOKUP_AND_DELETE_BATCH failed after %d entries: %s", len(out),
                            os.strerror(err))
                self.incomplete = True
                return out
            raise OSError(err, f"BPF_MAP_LOOKUP_AND_DELETE_BATCH: {os.strerror(err)}")


def _read_and_delete_one_by_one(table: Any) -> list[tuple[bytes, bytes]]:
    out = []
    for k in list(table.keys()):
        try:
            v = table[k]
        except KeyError:
            continue
        out.append((bytes(k), bytes(v)))
        del table[k]
    return out


@functools.lru_cache(maxsize=65536)   # the same few addresses every drain: ipaddress formatting is slow
def format_ip(family: int, raw: bytes) -> str:
    """AF_INET: the first 4 bytes; AF_INET6: 16 bytes, with IPv4-mapped addresses shown as IPv4."""
    if family == 2:
        return str(ipaddress.IPv4Address(raw[:4]))
    addr = ipaddress.IPv6Address(raw[:16])
    return str(addr.ipv4_mapped) if addr.ipv4_mapped else str(addr)


def lost_count(bpf: Any, index: int = 0) -> int:
    try:
        return int(bpf[b"lost"][ctypes.c_int(index)].value)
    except Exception:
        return 0


# -- network namespaces -------------------------------------------------------------------------------------

_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


@contextmanager
def in_netns(name: str | None) -> Iterator[None]:
    """Run the block with this thread in network namespace `name` (/run/netns/NAME); None: stay.

    Sockets (netlink included) created inside stay in that namespace after the block.
    """
    if name is None:
        yield
        return
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        target = os.open(f"/run/netns/{name}", os.O_RDONLY)
        try:
            _setns(target)
        finally:
            os.close(target)
        try:
            yield
        finally:
            _setns(own)
    finally:
        os.close(own)
