"""The flow-latency join on the processor contract: pairing, duplicates, expiry, clocks, redelivery after a crash."""

from __future__ import annotations

import orjson

from clocktower.schemas.analytics import FlowLatency
from clocktower.schemas.telemetry import FlowSample
from clocktower.streams.joins.flow_latency import FlowLatencyJoin
from clocktower.streams.processor import partition_of
from clocktower.streams.processor_runner import ProcessorRunner
from clocktower.streams.state_store import StateStore

T0 = 1_780_000_000 * 10**9
S = 10**9


def flow(node: str, direction: str, ts: int, seq: int = 1, sport: int = 40000) -> FlowSample:
    return FlowSample(node=node, ts_ns=ts, interface="eth0", direction=direction, src_ip="198.18.0.1",
                      dst_ip="198.18.1.1", src_port=sport, dst_port=4791, proto="roce", seq=seq, bytes=4096,
                      packets=1, retransmits=0, priority=3)


def _run(runner: ProcessorRunner, *events: FlowSample) -> list[FlowLatency]:
    out: list[FlowLatency] = []
    for e in events:   # one event per batch: every state entry goes through the codec in between
        out += runner.run(0, [e])   # type: ignore[arg-type]
    return out


def test_join_pairs_tx_and_rx_in_either_order() -> None:
    r = ProcessorRunner(FlowLatencyJoin())
    [a] = _run(r, flow("node-0", "tx", T0), flow("node-1", "rx", T0 + 7_000))
    assert a.latency_ns == 7_000 and a.node == "node-1" and a.src_node == "node-0"
    assert a.clock_corrected is False and a.corrected_latency_ns is None
    [b] = _run(r, flow("node-1", "rx", T0 + 9_000, seq=2), flow("node-0", "tx", T0 + 1_000, seq=2))
    assert b.latency_ns == 8_000 and b.tx_ns == T0 + 1_000


def test_a_duplicate_half_is_kept_once() -> None:
    j = FlowLatencyJoin()
    r = ProcessorRunner(j)
    assert _run(r, flow("node-0", "tx", T0), flow("node-0", "tx", T0 + 5)) == []
    assert j.duplicates == 1
    [a] = _run(r, flow("node-1", "rx", T0 + 100))
    assert a.tx_ns == T0   # the first half, not the copy


def test_a_half_expires_after_the_ttl_of_event_time_and_is_counted() -> None:
    j = FlowLatencyJoin(ttl_ns=10 * S)
    r = ProcessorRunner(j)
    _run(r, flow("node-0", "tx", T0, seq=1))
    _run(r, flow("node-0", "tx", T0 + 9 * S, seq=2), flow("node-1", "tx", T0 + 9 * S, seq=3, sport=1))
    assert len(r.store) == 3 and j.expired_halves == 0
    _run(r, flow("node-0", "tx", T0 + 11 * S, seq=4), flow("node-1", "tx", T0 + 11 * S, seq=5, sport=1))
    assert j.expired_halves == 1 and len(r.store) == 4      # seq 1 is gone, and its late rx invents nothing
    assert _run(r, flow("node-1", "rx", T0 + 12 * S, seq=1)) == []


def test_a_completed_segment_is_cleaned_up_without_counting_as_unjoined() -> None:
    j = FlowLatencyJoin(ttl_ns=S)
    r = ProcessorRunner(j)
    _run(r, flow("node-0", "tx", T0), flow("node-1", "rx", T0 + 10))
    _run(r, flow("node-0", "tx", T0 + 5 * S, seq=9), flow("node-1", "tx", T0 + 5 * S, seq=8, sport=1))
    assert j.expired_halves == 0 and len(r.store) == 2 and r.store.expired == 1


def test_join_applies_clock_correction_when_known() -> None:
    class Clocks:
        def to_reference(self, node: str, local_ns: int) -> tuple[int, int]:
            return (local_ns - 1_000, 30) if node == "node-1" else (local_ns, 20)

    [a] = _run(ProcessorRunner(FlowLatencyJoin(clocks=Clocks())), flow("node-0", "tx", T0),
               flow("node-1", "rx", T0 + 6_000))
    assert a.latency_ns == 6_000 and a.corrected_latency_ns == 5_000 and a.error_bound_ns == 50 and a.clock_corrected


def test_a_replay_after_a_crash_re_emits_what_the_crash_may_have_lost() -> None:
    """Killed after its state was written but before its output was: the replayed half gives the result again."""
    backing: dict[bytes, bytes] = {}
    first = ProcessorRunner(FlowLatencyJoin(), StateStore(FlowLatencyJoin(), backing))
    events = [flow("node-0", "tx", T0 + i, seq=i) for i in range(5)] + \
             [flow("node-1", "rx", T0 + 1_000 + i, seq=i) for i in range(5)]
    done = _run(first, *events)
    assert len(done) == 5
    restarted = ProcessorRunner(FlowLatencyJoin(), StateStore(FlowLatencyJoin(), backing))   # same table
    restarted.store.reload()
    again = _run(restarted, *events[3:])     # its last commit was after event 3
    assert {(f.seq, f.latency_ns) for f in again} <= {(f.seq, f.latency_ns) for f in done}
    assert {f.seq for f in again} == {0, 1, 2, 3, 4}          # every rx replayed re-emits its segment
    assert len(restarted.store) == 5                          # and nothing new waits as an orphan half


def test_state_keys_stay_in_the_partition_of_their_flow() -> None:
    j = FlowLatencyJoin()
    backing: dict[bytes, bytes] = {}
    r = ProcessorRunner(j, StateStore(j, backing))
    e = flow("node-0", "tx", T0, seq=3, sport=555)
    _run(r, e)
    [key] = backing
    *five, seq = orjson.loads(key)
    assert seq == 3 and partition_of(orjson.dumps(five).decode(), 6) == partition_of(j.partition_key(e), 6)


def test_halves_wait_for_a_receiver_whose_records_come_30_s_late() -> None:
    """The rx side's regrouping worker was killed and caught up 30 s later: every segment still joins."""
    j = FlowLatencyJoin(ttl_ns=10 * S)
    r = ProcessorRunner(j)
    out = _run(r, flow("node-0", "tx", T0 - S, seq=99), flow("node-1", "rx", T0 - S, seq=99))   # both known
    for i in range(40):   # 40 s of tx halves from node-0, and other flows of other nodes moving time on
        out += _run(r, flow("node-0", "tx", T0 + i * S, seq=i),
                    flow("node-2", "tx", T0 + i * S, seq=i, sport=2), flow("node-3", "rx", T0 + i * S, seq=i, sport=2))
    assert len(out) == 41 and j.expired_halves == 0
    late = _run(r, *[flow("node-1", "rx", T0 + i * S + 5_000, seq=i) for i in range(40)])
    assert len(late) == 40 and j.expired_halves == 0


def test_a_key_that_comes_round_again_starts_a_new_segment() -> None:
    """A sender whose seq restarted (a new run, a restarted agent) reuses keys within the TTL: new pairs join."""
    j = FlowLatencyJoin()
    r = ProcessorRunner(j)
    [first] = _run(r, flow("node-0", "tx", T0), flow("node-1", "rx", T0 + 7_000))
    [again] = _run(r, flow("node-0", "tx", T0 + 2 * S), flow("node-1", "rx", T0 + 2 * S + 9_000))
    assert (first.tx_ns, first.latency_ns) == (T0, 7_000) and (again.tx_ns, again.latency_ns) == (T0 + 2 * S, 9_000)
    assert j.reused_keys == 1 and j.duplicates == 0
