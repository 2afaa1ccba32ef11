"""The sink's flush policy: a batch is due when full or old; once caught up, every batch when enough rows wait."""

from __future__ import annotations

from clocktower.sinks.clickhouse.batch_set import BatchSet, FlushPolicy
from tests.test_sink_resume import _links

T = "telemetry.links"


def test_caught_up_every_batch_is_due_once_a_full_batch_s_rows_wait_in_all() -> None:
    batches = BatchSet(FlushPolicy(max_rows=100, max_age_s=60))
    batches.add(T, 0, 0, _links(0, 40))
    batches.add(T, 1, 0, _links(1, 59))
    assert batches.due_keys() == [] and batches.due_keys(caught_up=True) == [], "99 rows: a trickle waits"
    batches.add(T, 1, 1, _links(2, 1))
    assert batches.due_keys() == [], "not full, not old"
    assert sorted(batches.due_keys(caught_up=True)) == [(T, 0), (T, 1)], "100 rows in all: everything goes"
