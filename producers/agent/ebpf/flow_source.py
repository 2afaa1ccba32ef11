"""The node agent's flow source: exact per-flow socket bytes, TCP retransmits and connection lifecycle.

BPF (flows.bpf.c, compiled by BCC, tracepoints only since this kernel has no kprobes/fentry):

- sock:sock_send_length / sock:sock_recv_length: payload bytes of every TCP or connected-UDP socket
  call that moved data (ret > 0; recv with MSG_PEEK is skipped), by 5-tuple and direction. The
  5-tuple is read from sk->__sk_common (IPv4 and IPv6; IPv4-mapped IPv6 addresses are reported as
  IPv4). It is the packet's direction: tx has src = this node's end, rx has src = the remote end, so
  a sender's tx and the receiver's rx of one flow carry the same 5-tuple.
- tcp:tcp_retransmit_skb: retransmitted segments, counted on the tx 5-tuple.
- sock:inet_sock_set_state: every TCP state change, through a ring buffer, as ConnectionState
  (5-tuple with src = local end, states named as in the kernel without the TCP_ prefix: SYN_SENT,
  ESTABLISHED, FIN_WAIT1, ..., CLOSE). Its ts_ns is the kernel's time of the change.

Counting per time slot, draining less often: the kernel side keys every counter by (flow, slot), slot =
bpf_ktime_get_ns() // slot_ms, so the resolution is the slot (default 10 ms) whatever the drain period
(default 100 ms). The cost is in waking Python, not in the data: measured on a 2-core VM under 2 Gbit/s
of loopback TCP (benchmarks/agent_overhead.py), a drain every 10 ms cost 6.4 % of a core, ~150 us of CPU
per wake (the first syscall after a wake alone ~60 us cold, then the map reads and the flip), and 1.46 %
every 100 ms; aggregating in BPF keeps 10 ms rows at the 100 ms drain's cost.

A thread wakes every `drain_ms` (time.sleep): it reads and deletes the counter map the previous drain
flipped away from and flips again (DoubleBuffer), so each count is read exactly once. A slot current at a
flip has counts in both maps; those entries are held in a small dict and merged with the next drain's
(SlotAggregator), and each (flow, direction, slot) becomes one FlowCounters (source "sock"; `packets` is
0, the socket layer sees no packets) once its slot is over and both maps that could hold it have been
read: rows arrive one to two drain periods late. `ts_ns` is the slot's start on the wall clock (its
CLOCK_MONOTONIC start plus the wall-minus-monotonic offset, WallClock) and `interval_ns` the slot length,
so a flow's rows are distinct and slot-aligned and its bytes summed over rows are exact. Only (flow, slot)
pairs with activity are emitted. `stop()` detaches the programs, then emits everything still held. With
`tc_interfaces`, a TcClassifier on those interfaces (same slots) is drained by the same thread
(FlowCounters with source "tc").

The maps hold `max_flows` flows per drain period: max_flows x (slots per drain period + 2) entries each.

Runtime needs: root (CAP_BPF + CAP_PERFMON, CAP_NET_ADMIN for tc), tracefs mounted, Debian's
python3-bpfcc importable, and kernel headers: `kernel_source`, $BCC_KERNEL_SOURCE,
/lib/modules/$(uname -r)/build, or .cache/kernel-headers/ (`clocktower agent setup-ebpf` sets all this up).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from clocktower.producers.agent.ebpf._bcc import (
    PROTO,
    DoubleBuffer,
    SlotAggregator,
    WallClock,
    bcc_problem,
    build_flow_counters,
    compile_bpf,
    find_kernel_source,
    format_ip,
    lost_count,
    privilege_problem,
    slot_map_entries,
    tracepoints_problem,
)
from clocktower.producers.agent.ebpf.tc_classifier import Interface, TcClassifier
from clocktower.producers.agent.source import Availability, Emit
from clocktower.schemas.event import Event
from clocktower.schemas.telemetry import ConnectionState, FlowCounters

PROGRAM = Path(__file__).with_name("flows.bpf.c")
TRACEPOINTS = ("sock:sock_send_length", "sock:sock_recv_length", "tcp:tcp_retransmit_skb",
               "sock:inet_sock_set_state")
TCP_STATES = {1: "ESTABLISHED", 2: "SYN_SENT", 3: "SYN_RECV", 4: "FIN_WAIT1", 5: "FIN_WAIT2",
              6: "TIME_WAIT", 7: "CLOSE", 8: "CLOSE_WAIT", 9: "LAST_ACK", 10: "LISTEN", 11: "CLOSING",
              12: "NEW_SYN_RECV", 13: "BOUND_INACTIVE"}
FIELDS = ("bytes", "calls", "retransmits")


class FlowSource:
    name = "flows"

    def __init__(self, node: str, drain_ms: float = 100.0, kernel_source: str | Path | None = None,
                 tc_interfaces: Sequence[Interface] = (), max_flows: int = 8192,
                 ringbuf_pages: int = 256, slot_ms: float = 10.0) -> None:
        if drain_ms <= 0:
            raise ValueError("drain_ms must be positive")
        if slot_ms <= 0 or slot_ms * 1e6 < 1:
            raise ValueError("slot_ms must be at least 1 ns")
        self.node = node
        self.drain_ms = drain_ms
        self.drain_s = drain_ms / 1000.0
        self.slot_ms = slot_ms
        self.slot_ns = round(slot_ms * 1e6)
        self.kernel_source = kernel_source
        self.tc_interfaces = tuple(tc_interfaces)
        self.max_flows = max_flows
        self.ringbuf_pages = ringbuf_pages
        self.counts: Counter[str] = Counter()
        self.lost = 0                          # map updates or state events the kernel side had to drop
        self.unattributed = 0                  # socket calls whose 5-tuple could not be read (not counted)
        self.errors: Counter[str] = Counter()  # drain failures, by exception type (the thread keeps going)
        self.compile_s = 0.0
        self.tc: TcClassifier | None = None
        self._bpf: Any = None
        self._buffer: DoubleBuffer | None = None
        self._slots: SlotAggregator | None = None
        self._described: dict[bytes, dict[str, Any]] = {}   # a flow key's fields, built once per flow
        self._clock = WallClock()
        self._emit: Emit | None = None
        self._states: list[ConnectionState] = []
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._drains = 0
        self._stats_every = max(1, round(1000 / drain_ms))

    # -- Source protocol --------------------------------------------------------------------------------

    def check(self) -> Availability:
        try:
            problems = [p for p in (bcc_problem(), tracepoints_problem(TRACEPOINTS),
                                    privilege_problem(need_net_admin=bool(self.tc_interfaces))) if p]
            headers, where = find_kernel_source(self.kernel_source)
            if headers is None:
                problems.append(where)
        except Exception as exc:                       # check() never raises
            return Availability(False, f"cannot check the eBPF flow source: {exc!r}")
        if problems:
            return Availability(False, "; ".join(problems))
        tc = f", tc on {', '.join(self._tc_labels())}" if self.tc_interfaces else ""
        return Availability(True, f"eBPF tracepoints (sock, tcp) with kernel headers from {where}{tc}")

    def start(self, emit: Emit) -> None:
        if self._thread is not None:
            raise RuntimeError("FlowSource already started")
        availability = self.check()
        if not availability.ok:
            raise RuntimeError(f"the eBPF flow source cannot run here: {availability.reason}")
        headers, _ = find_kernel_source(self.kernel_source)
        assert headers is not None
        started = time.monotonic()
        entries = slot_map_entries(self.max_flows, self.drain_ms, self.slot_ms)
        self._bpf = compile_bpf(PROGRAM.read_text(), headers, [
            f"-DMAX_FLOWS={entries}", f"-DSLOT_NS={self.slot_ns}ULL", f"-DRINGBUF_PAGES={self.ringbuf_pages}"])
        try:
            self._buffer = DoubleBuffer(self._bpf, ("flows0", "flows1"))
            self._slots = SlotAggregator(self.slot_ns, self._buffer.key_type, self._buffer.leaf_type, FIELDS)
            self._bpf[b"states"].open_ring_buffer(self._on_state)
            if self.tc_interfaces:
                self.tc = TcClassifier(self.node, self.tc_interfaces, headers, self.max_flows,
                                       slot_ms=self.slot_ms, drain_ms=self.drain_ms)
                self.tc.start()
        except Exception:
            self._bpf.cleanup()
            self._bpf = None
            raise
        self.compile_s = time.monotonic() - started
        self._emit = emit
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="flows-drain", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop draining, detach every program (and tc filter/qdisc), emit everything counted or held."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        offset = self._clock.offset()
        tc_out: list[FlowCounters] = []
        if self.tc is not None:
            tc_out = self.tc.stop(offset)
            self.tc = None
        bpf = self._bpf
        for tp in list(bpf.tracepoint_fds):            # detach first, so the last read is final
            bpf.detach_tracepoint(tp)
        bpf.ring_buffer_consume()
        assert self._slots is not None
        flows = self._flow_counters(self._slots.add(self._buffer.read_all(), None), offset) + tc_out
        self.lost, self.unattributed = lost_count(bpf), lost_count(bpf, 1)
        bpf.cleanup()
        self._bpf = None
        self._buffer = None
        self._publish(flows)

    # -- draining ---------------------------------------------------------------------------------------

    def _run(self) -> None:
        # time.sleep, not Event.wait: a condition-variable wait with a timeout costs more than a drain;
        # stop() is seen within one period.
        next_at = time.monotonic() + self.drain_s
        while True:
            time.sleep(max(0.0, next_at - time.monotonic()))
            if self._stop.is_set():
                return
            next_at += self.drain_s
            if next_at < time.monotonic():              # fell behind (a slow emit): skip, do not burst
                next_at = time.monotonic() + self.drain_s
            try:
                self.drain()
            except Exception as exc:                    # a bad drain must not kill the source
                self.errors[type(exc).__name__] += 1

    def drain(self) -> None:
        """One drain: read the idle map and flip, emit complete slots, consume state events (the thread)."""
        assert self._bpf is not None and self._buffer is not None and self._slots is not None
        items, settled_ns = self._buffer.flip_and_read()
        offset = self._clock.offset()
        flows = self._flow_counters(self._slots.add(items, settled_ns), offset)
        if self.tc is not None:
            flows += self.tc.drain(offset)
        self._bpf.ring_buffer_consume()
        self._drains += 1
        if self._drains % self._stats_every == 1 % self._stats_every:   # stats: two map reads, once a second
            self.lost, self.unattributed = lost_count(self._bpf), lost_count(self._bpf, 1)
        self._publish(flows)

    def _publish(self, flows: list[FlowCounters]) -> None:
        states, self._states = self._states, []
        for batch in (states, flows):
            if batch and self._emit is not None:
                events: list[Event] = [*batch]
                self._emit(events)
                self.counts[batch[0].SCHEMA] += len(batch)

    def _flow_counters(self, rows: list[tuple[bytes, int, list[int]]], wall_offset_ns: int) -> list[FlowCounters]:
        """One FlowCounters per complete (flow, slot): ts_ns = the slot's start on the wall clock."""
        slot_ns = self.slot_ns
        described = self._described
        out = []
        for flow, slot, (nbytes, _calls, retransmits) in rows:
            if not (nbytes or retransmits):
                continue
            fields = described.get(flow) or self._describe(flow)
            out.append(build_flow_counters(**fields, ts_ns=slot * slot_ns + wall_offset_ns, bytes=nbytes,
                              retransmits=min(retransmits, 2**32 - 1), interval_ns=slot_ns))
        return out

    def _describe(self, flow: bytes) -> dict[str, Any]:
        """The fields of a flow's rows that its key gives (parsed once per flow, not once per slot)."""
        assert self._slots is not None
        if len(self._described) >= 65536:                    # ephemeral ports: do not grow forever
            self._described.clear()
        k = self._slots.key(flow)
        fields = self._described[flow] = dict(
            node=self.node, source="sock", interface="", direction="tx" if k.dir == 0 else "rx",
            src_ip=format_ip(k.family, bytes(k.saddr)), dst_ip=format_ip(k.family, bytes(k.daddr)),
            src_port=k.sport, dst_port=k.dport, proto=PROTO.get(k.proto, "tcp"), priority=0, packets=0)
        return fields

    def _on_state(self, _ctx: Any, data: Any, _size: int) -> None:
        e = self._bpf[b"states"].event(data)
        wall_offset = self._clock.offset()                   # bpf_ktime_get_ns() is CLOCK_MONOTONIC
        self._states.append(ConnectionState(
            node=self.node, ts_ns=e.ts_ns + wall_offset,
            src_ip=format_ip(e.family, bytes(e.saddr)), dst_ip=format_ip(e.family, bytes(e.daddr)),
            src_port=e.sport, dst_port=e.dport,
            old_state=TCP_STATES.get(e.oldstate, str(e.oldstate)),
            new_state=TCP_STATES.get(e.newstate, str(e.newstate))))

    def _tc_labels(self) -> list[str]:
        return [i if isinstance(i, str) else f"{i[0]}/{i[1]}" for i in self.tc_interfaces]
