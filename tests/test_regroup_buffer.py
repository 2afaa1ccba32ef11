"""Regrouped events share records (streams/regroup_buffer.py): full parts go at once, the rest within the linger,
everything before a commit, nothing after a revoke; and in the topology, the records that come out carry every
input record's events, in order, each to the partition its key names."""

from __future__ import annotations

import time

from clocktower.control.issuer import CommandIssuer
from clocktower.schemas.codec import decode_batch
from clocktower.schemas.telemetry import FlowSample
from clocktower.streams.joins.flow_latency import FlowLatencyJoin
from clocktower.streams.processor import partition_of
from clocktower.streams.processor_context import ProcessorContext
from clocktower.streams.registry import build, partitions, repartition_topic
from clocktower.streams.regroup_buffer import RegroupBuffer
from clocktower.streams.remediation_budget import RemediationBudget
from clocktower.streams.topology import Topology
from tests.control_keys import TEST_SIGNER
from tests.event_samples import SAMPLES

T0 = int(time.time() * 1e9) - 60 * 10**9   # in the past: within the decoder's future skew


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_full_part_goes_at_once_and_the_rest_after_the_linger() -> None:
    clock = _Clock()
    buf = RegroupBuffer(0.05, max_events=3, clock=clock)
    assert buf.add("r", 0, ["a", "b"]) == [] and buf.add("r", 1, ["x"]) == []
    assert buf.add("r", 0, ["c", "d"]) == [("r", 0, ["a", "b", "c", "d"])]   # full: one part, in order
    assert buf.due() == [] and len(buf) == 1
    clock.now += 0.049
    assert buf.due() == []
    clock.now += 0.002
    assert buf.due() == [("r", 1, ["x"])] and len(buf) == 0


def test_a_commit_takes_everything_and_a_revoke_drops_everything() -> None:
    buf = RegroupBuffer(60.0, clock=_Clock())
    buf.add("r", 0, ["a"])
    buf.add("r", 2, ["b", "c"])
    assert sorted(buf.drain()) == [("r", 0, ["a"]), ("r", 2, ["b", "c"])] and buf.drain() == []
    buf.add("r", 1, ["d"])
    assert buf.drop() == 1 and buf.due() == [] and buf.drain() == []


def _flows(node: str, seqs: range) -> list[FlowSample]:
    base = SAMPLES["flow_sample"]
    return [FlowSample(**{**base, "node": node, "ts_ns": T0 + s, "seq": s, "src_port": 40000 + s % 17})
            for s in seqs]


def _topology(linger_s: float) -> Topology:
    return Topology(build(ProcessorContext()), CommandIssuer(TEST_SIGNER), RemediationBudget(), lambda p: None,
                    regroup_linger_s=linger_s)


def test_the_topology_joins_input_records_into_one_record_per_partition() -> None:
    topic = repartition_topic(FlowLatencyJoin)
    n = partitions(FlowLatencyJoin)
    first, second = _flows("node-0", range(0, 40)), _flows("node-0", range(40, 80))
    direct = _topology(0.0)
    unbuffered = [o for batch in (first, second) for o in direct.route("telemetry.flows", 0, batch, [])
                  if o.topic == topic]
    assert len(unbuffered) > n // 2          # each input record makes a record per partition its flows go to

    buffered = _topology(60.0)
    assert [o for batch in (first, second) for o in buffered.route("telemetry.flows", 0, batch, [])
            if o.topic == topic] == []       # waiting
    outs = [o for o in buffered.drain_regrouped() if o.topic == topic]
    assert len(outs) == len({o.partition for o in unbuffered}) < len(unbuffered)
    key = FlowLatencyJoin().partition_key
    for o in outs:
        events = _decode(o)
        assert all(partition_of(key(e), n) == o.partition for e in events)
        assert [e.seq for e in events] == sorted(e.seq for e in events)   # in input order
    assert sorted(e.seq for o in outs for e in _decode(o)) == list(range(80))
    assert buffered.drain_regrouped() == []

    buffered.route("telemetry.flows", 0, first, [])
    assert buffered.drop_pending() == 40 and buffered.drain_regrouped() == []


def _decode(o) -> list[FlowSample]:  # noqa: ANN001 - an Out
    return decode_batch("telemetry.flows", o.key, o.value, o.headers).events



def test_full_parts_wait_for_the_sender_not_for_the_route() -> None:
    """With a buffer, `route` returns no repartition record: a part that fills up is taken by `regrouped_ready`,
    which the worker hands to its ordered sender at once (streams/engine/ordered_sends.py)."""
    topology = _topology(60.0)
    topology.regroup.max_events = 5
    topic = repartition_topic(FlowLatencyJoin)
    assert [o for o in topology.route("telemetry.flows", 0, _flows("node-0", range(200)), []) if o.topic == topic] == []
    ready = topology.regrouped_ready()
    assert ready and all(o.topic == topic for o in ready)
    taken = sorted(e.seq for o in ready for e in _decode(o))
    rest = sorted(e.seq for o in topology.drain_regrouped() for e in _decode(o))
    assert len(taken) >= 5 * len({o.partition for o in ready}) and sorted(taken + rest) == list(range(200))
    assert topology.regrouped_ready() == []
