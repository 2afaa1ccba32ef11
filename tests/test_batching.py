"""The sink's batching: per (topic, partition) batches, the flush policy and the offsets to commit."""

from __future__ import annotations

import time

import pyarrow as pa

from clocktower.schemas.columns import model_columns
from clocktower.schemas.control import ControlCommand
from clocktower.schemas.telemetry import GpuHealth, LinkState
from clocktower.sinks.clickhouse.batch_set import BatchSet, FlushPolicy
from tests.event_samples import GPU_READINGS

T0 = 1_780_000_000 * 10**9


def links(n: int, node: str = "node-0") -> list[LinkState]:
    return [LinkState(node=node, ts_ns=T0 + i, interface="eth0", kind="ethernet", up=True, carrier_changes=i,
                      speed_mbps=0, operstate="up", carrier=True)
            for i in range(n)]


def test_batches_are_kept_per_topic_and_partition() -> None:
    bs = BatchSet(FlushPolicy(max_rows=100, max_age_s=60))
    bs.add("telemetry.links", 0, 10, links(3))
    bs.add("telemetry.links", 0, 11, links(2))
    bs.add("telemetry.links", 1, 5, links(1))
    assert set(bs.batches) == {("telemetry.links", 0), ("telemetry.links", 1)}
    b = bs.batches[("telemetry.links", 0)]
    assert (b.rows, b.first_offset, b.last_offset) == (5, 10, 11)
    assert bs.offsets == {("telemetry.links", 0): 12, ("telemetry.links", 1): 6}
    assert not bs.due()


def test_due_at_max_rows_and_at_max_age() -> None:
    bs = BatchSet(FlushPolicy(max_rows=10, max_age_s=60))
    bs.add("telemetry.links", 0, 0, links(9))
    assert not bs.due()
    bs.add("telemetry.links", 0, 1, links(1))
    assert bs.due()
    aged = BatchSet(FlushPolicy(max_rows=10_000, max_age_s=0.05))
    aged.add("telemetry.links", 0, 0, links(1))
    assert not aged.due()
    time.sleep(0.06)
    assert aged.due()


def test_skipped_records_advance_offsets_without_rows() -> None:
    bs = BatchSet(FlushPolicy(max_rows=10, max_age_s=0.01))
    bs.skip("telemetry.links", 0, 41)
    time.sleep(0.02)
    assert bs.due(), "a dead-lettered record alone must still get its offset committed"
    batches, offsets = bs.take()
    assert batches == [] and offsets == {("telemetry.links", 0): 42}
    assert bs.take() == ([], {})


def test_dedup_token_depends_on_offsets_and_record_bytes() -> None:
    a, b, c = BatchSet(), BatchSet(), BatchSet()
    for bs, last in ((a, b"r9"), (b, b"r9"), (c, b"new record at a reused offset")):
        bs.add("telemetry.links", 2, 7, links(3), b"r7")
        bs.add("telemetry.links", 2, 9, links(1), last)
    ta = a.batches[("telemetry.links", 2)].dedup_token()
    assert ta == b.batches[("telemetry.links", 2)].dedup_token() and ta.startswith("telemetry.links:2:7-9:4:")
    assert ta != c.batches[("telemetry.links", 2)].dedup_token()


def test_arrow_columns_follow_the_model() -> None:
    bs = BatchSet()
    bs.add("telemetry.gpu", 1, 3, [GpuHealth(node="n", ts_ns=T0, gpu=1, uuid="u",
                                             **{**GPU_READINGS, "nvlink_errors": [1, 2]})])
    bs.add("control.commands", 0, 8, [ControlCommand(node="n", ts_ns=T0, command_id="c", action="drain",
                                                     target="n", params={"a": "b"}, expires_ns=T0 + 1,
                                                     signature="s")])
    gpu = bs.batches[("telemetry.gpu", 1)].to_arrow()
    assert gpu.column_names == [c.name for c in model_columns(GpuHealth)] + ["_partition", "_offset", "_topic",
                                                                             "_node_mac"]
    assert gpu.column("nvlink_errors").type == pa.list_(pa.uint64())
    assert gpu.column("_offset").to_pylist() == [3] and gpu.column("_partition").to_pylist() == [1]
    assert gpu.column("_topic").to_pylist() == ["telemetry.gpu"] and gpu.column("_node_mac").to_pylist() == [
        "unchecked"]
    cmd = bs.batches[("control.commands", 0)].to_arrow()
    assert cmd.column("params").to_pylist() == [[("a", "b")]]


def test_only_due_partitions_are_taken() -> None:
    bs = BatchSet(FlushPolicy(max_rows=10, max_age_s=60))
    bs.add("telemetry.links", 0, 3, links(12))
    bs.add("telemetry.gpu", 1, 4, [GpuHealth(node="n", ts_ns=T0, gpu=0, uuid="u", **GPU_READINGS)])
    assert bs.due_keys() == [("telemetry.links", 0)]
    batches, offsets = bs.take(bs.due_keys())
    assert [b.spec.table for b in batches] == ["link_states"] and offsets == {("telemetry.links", 0): 4}
    assert list(bs.batches) == [("telemetry.gpu", 1)] and bs.offsets == {("telemetry.gpu", 1): 5}
