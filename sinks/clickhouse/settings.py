"""The ClickHouse sink's settings (CLOCKTOWER_* variables); clocktower/config.py composes them with the others."""

from __future__ import annotations

from pydantic import Field

from clocktower.runtime.settings import RuntimeSettings


class SinkSettings(RuntimeSettings):
    metrics_port: int = Field(default=0, ge=0, le=65535, description="the sink's Prometheus endpoint (binds "
                              "CLOCKTOWER_METRICS_HOST); 0 disables it")
    flush_rows: int = Field(default=10_000, ge=1)
    flush_interval_s: float = Field(default=1.0, gt=0)
    sink_instance_id: str | None = Field(default=None, description="Kafka static member id; unique per sink")
    clickhouse_cluster: str | None = Field(
        default=None, pattern=r"^[A-Za-z][A-Za-z0-9_]*$",
        description="a ClickHouse cluster (remote_servers) to create the tables ON CLUSTER: ReplicatedMergeTree "
                    "<table>_local per shard, and <table> as a Distributed table over them; unset: one server")
