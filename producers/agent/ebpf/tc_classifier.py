"""A tc clsact BPF classifier on chosen interfaces: packets and bytes per flow (5-tuple) and skb->priority.

One program (tc_flows.bpf.c) is attached as a direct-action filter on the ingress and egress hooks
of each interface, through pyroute2. It never drops: it counts and returns TC_ACT_UNSPEC (on to the next
filter, such as the actuator's flow redirect). `drain()` returns FlowCounters(source="tc") with `interface`
set; the FlowSource's drain thread calls it.

Counters are per time slot (`slot_ms`, 10 ms by default) and double-buffered, as in flow_source.py: the
kernel keys them by (flow, priority, slot), a drain reads the idle map and flips, and a slot is returned
once, merged across both maps, when it is complete; `ts_ns` is the slot's start on the wall clock and
`interval_ns` the slot length. The maps hold `max_flows` flows per `drain_ms` period.

Interfaces are names in this process's network namespace, or (netns, ifname) pairs for an interface
in a named namespace (/run/netns/NETNS); those are reported as "NETNS/ifname".

Hook for marking and shaping: `set_priority(...)` writes the `prio` map (5-tuple -> priority), which
the classifier applies to skb->priority before counting; on egress that selects an HTB class.

`stop()` removes the filters, and the clsact qdisc where this classifier added it (a clsact that was
there before is left, with only our filters removed).
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clocktower.producers.agent.ebpf._bcc import (
    PROTO,
    DoubleBuffer,
    SlotAggregator,
    WallClock,
    build_flow_counters,
    compile_bpf,
    format_ip,
    in_netns,
    lost_count,
    slot_map_entries,
)
from clocktower.runtime.clsact import EGRESS, INGRESS, ensure_clsact, release_clsact, remove_filter
from clocktower.schemas.telemetry import FlowCounters

PROGRAM = Path(__file__).with_name("tc_flows.bpf.c")
FILTER_PRIO = 0xC7A1 & 0xFFFF                  # our filters' tc priority, so stop() removes only ours
FIELDS = ("bytes", "packets")

Interface = str | tuple[str, str]


@dataclass
class _Attached:
    netns: str | None
    ifname: str
    index: int
    label: str
    created_qdisc: bool


class TcClassifier:
    def __init__(self, node: str, interfaces: Sequence[Interface], kernel_source: Path,
                 max_flows: int = 8192, slot_ms: float = 10.0, drain_ms: float = 100.0) -> None:
        if slot_ms <= 0 or slot_ms * 1e6 < 1 or drain_ms <= 0:
            raise ValueError("slot_ms (at least 1 ns) and drain_ms must be positive")
        self.node = node
        self.interfaces = [(None, i) if isinstance(i, str) else (i[0], i[1]) for i in interfaces]
        self.kernel_source = kernel_source
        self.max_flows = max_flows
        self.slot_ms = slot_ms
        self.slot_ns = round(slot_ms * 1e6)
        self.drain_ms = drain_ms
        self.bpf: Any = None
        self.buffer: DoubleBuffer | None = None
        self.slots: SlotAggregator | None = None
        self._described: dict[bytes, dict[str, Any]] = {}   # a flow key's fields, built once per flow
        self.clock = WallClock()
        self.attached: list[_Attached] = []
        self._labels: dict[int, str] = {}
        self.lost = 0
        self._drains = 0
        self._stats_every = max(1, round(1000 / drain_ms))

    def start(self) -> None:
        entries = slot_map_entries(self.max_flows, self.drain_ms, self.slot_ms)
        self.bpf = compile_bpf(PROGRAM.read_text(), self.kernel_source,
                               [f"-DMAX_FLOWS={entries}", f"-DSLOT_NS={self.slot_ns}ULL"])
        from bcc import BPF

        ingress = self.bpf.load_func(b"tc_ingress", BPF.SCHED_CLS)
        egress = self.bpf.load_func(b"tc_egress", BPF.SCHED_CLS)
        self.buffer = DoubleBuffer(self.bpf, ("counts0", "counts1"))
        self.slots = SlotAggregator(self.slot_ns, self.buffer.key_type, self.buffer.leaf_type, FIELDS)
        try:
            for netns, ifname in self.interfaces:
                self._attach(netns, ifname, ingress, egress)
        except Exception:
            self.stop()
            raise

    def _attach(self, netns: str | None, ifname: str, ingress: Any, egress: Any) -> None:
        from pyroute2 import IPRoute

        with in_netns(netns):
            ip = IPRoute()
        with ip:
            found = ip.link_lookup(ifname=ifname)
            if not found:
                raise OSError(f"no interface {ifname!r}" + (f" in network namespace {netns}" if netns else ""))
            index = found[0]
            label = f"{netns}/{ifname}" if netns else ifname
            if index in self._labels:
                raise OSError(f"{label} and {self._labels[index]} share ifindex {index}; "
                              "the classifier keys its counters by ifindex")
            entry = _Attached(netns, ifname, index, label, created_qdisc=ensure_clsact(ip, index))
            self.attached.append(entry)
            self._labels[index] = label
            # replace, not add: a filter left at our handle and prio by an agent that was killed replaces cleanly
            for parent, fn in ((INGRESS, ingress), (EGRESS, egress)):
                ip.tc("replace-filter", "bpf", index, ":1", fd=fn.fd, name=fn.name, parent=parent,
                      classid=1, direct_action=True, prio=FILTER_PRIO)

    def set_priority(self, src_ip: str, dst_ip: str, src_port: int, dst_port: int, proto: str,
                     priority: int | None) -> None:
        """Mark packets of this 5-tuple (as they appear on the wire) with skb->priority; None clears."""
        table = self.bpf[b"prio"]
        key = table.Key()
        src, dst = ipaddress.ip_address(src_ip), ipaddress.ip_address(dst_ip)
        key.family = 2 if src.version == 4 else 10
        ctypes.memmove(key.saddr, src.packed, len(src.packed))
        ctypes.memmove(key.daddr, dst.packed, len(dst.packed))
        key.sport, key.dport = src_port, dst_port
        key.proto = {"tcp": 6, "udp": 17}[proto]
        if priority is None:
            with contextlib.suppress(KeyError):
                del table[key]
        else:
            table[key] = ctypes.c_uint32(priority)

    def drain(self, wall_offset_ns: int | None = None, final: bool = False) -> list[FlowCounters]:
        """The (flow, slot) counters that are complete; `final` (programs detached): all of them.

        `wall_offset_ns` turns CLOCK_MONOTONIC into the wall clock (FlowSource passes its own, so both
        sources stamp a slot alike); None measures it here.
        """
        if self.buffer is None or self.slots is None:
            return []
        items, settled_ns = (self.buffer.read_all(), None) if final else self.buffer.flip_and_read()
        rows = self.slots.add(items, settled_ns)
        self._drains += 1
        if final or self._drains % self._stats_every == 1 % self._stats_every:   # a stat: one map read a second
            self.lost = lost_count(self.bpf)
        offset = self.clock.offset() if wall_offset_ns is None else wall_offset_ns
        slot_ns = self.slot_ns
        described = self._described
        out = []
        for flow, slot, (nbytes, packets) in rows:
            fields = described.get(flow) or self._describe(flow)
            out.append(build_flow_counters(**fields, ts_ns=slot * slot_ns + offset, bytes=nbytes, packets=packets,
                              interval_ns=slot_ns))
        return out

    def _describe(self, flow: bytes) -> dict[str, Any]:
        """The fields of a flow's rows that its key gives (parsed once per flow, not once per slot)."""
        assert self.slots is not None
        if len(self._described) >= 65536:                    # ephemeral ports: do not grow forever
            self._described.clear()
        k = self.slots.key(flow)
        t = k.t
        fields = self._described[flow] = dict(
            node=self.node, source="tc", interface=self._labels.get(k.ifindex, str(k.ifindex)),
            direction="tx" if k.dir == 0 else "rx",
            src_ip=format_ip(t.family, bytes(t.saddr)), dst_ip=format_ip(t.family, bytes(t.daddr)),
            src_port=t.sport, dst_port=t.dport, proto=PROTO.get(t.proto, "tcp"), priority=k.priority,
            retransmits=0)
        return fields

    def detach(self) -> None:
        """Remove our filters, and a clsact qdisc we added once no filter of anyone is left on it. Safe twice."""
        from pyroute2 import IPRoute
        from pyroute2.netlink.exceptions import NetlinkError

        for entry in reversed(self.attached):
            try:
                with in_netns(entry.netns):
                    ip = IPRoute()
                with ip:
                    for parent in (INGRESS, EGRESS):   # only ours: other tools may have filters on this clsact
                        remove_filter(ip, entry.index, parent, FILTER_PRIO)
                    release_clsact(ip, entry.index, entry.created_qdisc)
            except (NetlinkError, OSError):
                pass                                    # interface or namespace already gone
        self.attached.clear()

    def stop(self, wall_offset_ns: int | None = None) -> list[FlowCounters]:
        """Detach, then return everything counted since the last drain or still held."""
        self.detach()
        out: list[FlowCounters] = []
        if self.bpf is not None:
            out = self.drain(wall_offset_ns, final=True)
            self.bpf.cleanup()
            self.bpf = None
            self.buffer = None
        return out
