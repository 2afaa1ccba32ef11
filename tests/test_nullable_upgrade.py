"""A gpu_health table made before its readings were nullable is upgraded at start, so null is stored as NULL.

Without the upgrade ClickHouse stores an Arrow null in a non-Nullable column as 0: the fake reading
(power_w 0.0 for a lost GPU or an unsupported sensor) that required, nullable readings exist to prevent.
"""

from __future__ import annotations

import time

from clocktower.schemas.clickhouse_ddl import create_table_sql
from clocktower.schemas.columns import model_columns
from clocktower.schemas.telemetry import GpuHealth
from clocktower.schemas.topics import BY_MODEL
from clocktower.sinks.clickhouse.batch_set import BatchSet
from clocktower.sinks.clickhouse.table_writer import TableWriter
from tests.event_samples import SAMPLES


def _old_ddl() -> str:
    """gpu_health as the previous version made it: the same columns, none nullable."""
    ddl = create_table_sql(BY_MODEL[GpuHealth])[0]
    for c in model_columns(GpuHealth):
        if c.ch_type.startswith("Nullable("):
            ddl = ddl.replace(f"`{c.name}` {c.ch_type}", f"`{c.name}` {c.ch_type[9:-1]}")
    return ddl


def test_old_gpu_table_gets_nullable_readings_and_stores_null_not_zero(tmp_path) -> None:  # noqa: ANN001
    from tests.conftest import start_services

    services = start_services(tmp_path)
    try:
        client = services.client
        client.command(_old_ddl())
        now = time.time_ns()
        old = GpuHealth(**{**SAMPLES["gpu_health"], "ts_ns": now - 2})
        batches = BatchSet()
        batches.add("telemetry.gpu", 0, 0, [old])
        writer = TableWriter(client)
        writer.insert(batches.take()[0][0])                      # a row stored before the upgrade
        writer.ensure_schema()
        types = dict(client.query("SELECT name, type FROM system.columns WHERE table = 'gpu_health'").result_rows)
        assert types["power_w"] == "Nullable(Float64)" and types["remap_pending"] == "Nullable(Bool)"
        assert types["xid"] == "UInt32" and types["nvlink_errors"] == "Array(UInt64)"   # not readings: unchanged
        lost = GpuHealth(**{**SAMPLES["gpu_health/lost"], "ts_ns": now - 1})
        batches.add("telemetry.gpu", 0, 1, [lost])
        writer.insert(batches.take()[0][0])
        rows = client.query("SELECT lost, power_w, ecc_corrected FROM gpu_health ORDER BY ts_ns").result_rows
        assert rows == [(False, 550.0, 0), (True, None, None)]
        writer.ensure_schema()                                   # a second start changes nothing
    finally:
        services.stack.stop()
