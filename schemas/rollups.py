"""Rollups: materialized views that keep per-minute and per-iteration aggregates of the raw tables.

Dashboards over days read these instead of billions of raw rows. Each is an AggregatingMergeTree fed by a
materialized view on its source table's inserts; read it with the -Merge combinators (quantilesTDigestMerge,
avgMerge) and GROUP BY its key, or the SimpleAggregateFunction columns with their plain function (sum, max, min).

Limits, on purpose:
- A view sees inserts, not FINAL: a row a redelivery writes again into a REPLACING source counts twice in its
  rollup (flow_latency, iteration_breakdown; rare: a stream worker's restart).
- A rollup covers the rows inserted after its migration created it; rows stored before stay in the raw tables
  only (a backfill racing the sink's inserts could count rows twice).
- Latency quantiles are t-digest estimates (quantilesTDigest), a few percent off the exact ones.
"""

from __future__ import annotations

from dataclasses import dataclass

from clocktower.schemas.clickhouse_ddl import Layout
from clocktower.schemas.column_types import SEQUENCE_CODEC, TIME_CODEC

RETENTION_DAYS = 400   # rollups outlive the raw rows (topics keep 1 to 30 days): a year of trends


@dataclass(frozen=True)
class Rollup:
    name: str               # the rollup table; its view is `<name>_mv`
    source: str             # the raw table it aggregates
    key: tuple[str, ...]    # ORDER BY: what a row aggregates over
    columns: str            # the table's columns, one "name Type" a line
    select: str             # the view's SELECT over the source (its FROM is added)
    time: str               # the column TTL counts from
    what: str               # one line for the docs
    migration: int = 3      # the migration that creates it (a rollup added later needs its own)

    def create_sql(self, layout: Layout) -> list[str]:
        """The rollup table, its view (ON CLUSTER: both per shard, the view on the shard's local source), and on a
        cluster the Distributed table over the shards' rollups, sharded as the source is (by node, or by job)."""
        table = (f"CREATE TABLE IF NOT EXISTS {layout.database}.`{layout.storage(self.name)}`{layout.on_cluster}\n"
                 f"(\n{self.columns}\n)\nENGINE = {layout.engine('AggregatingMergeTree')}\n"
                 f"ORDER BY ({', '.join(self.key)})\nTTL {self.time} + INTERVAL {RETENTION_DAYS} DAY")
        view = (f"CREATE MATERIALIZED VIEW IF NOT EXISTS {layout.database}.`{layout.storage(self.name)}_mv`"
                f"{layout.on_cluster}\nTO {layout.database}.`{layout.storage(self.name)}`\nAS {self.select}\n"
                f"FROM {layout.database}.`{layout.storage(self.source)}`\n{self.group_by}")
        return [table, view, *layout.distributed_sql(self.name, f"cityHash64({self.key[0]})")]

    @property
    def group_by(self) -> str:
        return f"GROUP BY {', '.join(self.key)}"


def _cols(*lines: str) -> str:
    return ",\n".join(f"    {line}" for line in lines)


ROLLUPS: tuple[Rollup, ...] = (
    Rollup("flow_latency_1m", "flow_latency", ("src_node", "node", "minute"), _cols(
        f"`minute` DateTime CODEC({TIME_CODEC})",
        "`src_node` LowCardinality(String)",
        "`node` LowCardinality(String)",
        "`packets` SimpleAggregateFunction(sum, UInt64)",
        "`corrected` SimpleAggregateFunction(sum, UInt64)",
        "`delay_quantiles_ns` AggregateFunction(quantilesTDigest(0.5, 0.9, 0.99), Int64)",
        "`max_delay_ns` SimpleAggregateFunction(max, Int64)",
        "`max_error_bound_ns` SimpleAggregateFunction(max, Int64)"),
        """SELECT toStartOfMinute(time) AS minute, src_node, node, count() AS packets,
  countIf(clock_corrected) AS corrected,
  quantilesTDigestState(0.5, 0.9, 0.99)(if(clock_corrected, assumeNotNull(corrected_latency_ns), latency_ns))
    AS delay_quantiles_ns,
  max(if(clock_corrected, assumeNotNull(corrected_latency_ns), latency_ns)) AS max_delay_ns,
  max(ifNull(error_bound_ns, 0)) AS max_error_bound_ns""", "minute",
        "one-way delay quantiles per sender → receiver and minute (the corrected delay where a clock estimate was "
        "there, else the raw one: `corrected` says how many were corrected)"),
    Rollup("iteration_stats", "iteration_breakdown", ("job", "iteration"), _cols(
        "`job` LowCardinality(String)",
        f"`iteration` UInt64 CODEC({SEQUENCE_CODEC})",
        "`ranks` SimpleAggregateFunction(sum, UInt64)",
        "`first_start_ns` SimpleAggregateFunction(min, Int64)",
        "`last_end_ns` SimpleAggregateFunction(max, Int64)",
        "`max_duration_ns` SimpleAggregateFunction(max, Int64)",
        "`compute_quantiles_ns` AggregateFunction(quantilesTDigest(0.5, 0.99), Int64)",
        "`max_compute_ns` SimpleAggregateFunction(max, Int64)",
        "`mean_comm_ns` AggregateFunction(avg, Int64)",
        "`total_comm_bytes` SimpleAggregateFunction(sum, UInt64)",
        f"`day` SimpleAggregateFunction(min, DateTime) CODEC({TIME_CODEC})"),
        """SELECT job, iteration, count() AS ranks, min(start_ns) AS first_start_ns, max(end_ns) AS last_end_ns,
  max(duration_ns) AS max_duration_ns, quantilesTDigestState(0.5, 0.99)(compute_ns) AS compute_quantiles_ns,
  max(compute_ns) AS max_compute_ns, avgState(comm_ns) AS mean_comm_ns, sum(comm_bytes) AS total_comm_bytes,
  toStartOfDay(min(time)) AS day""", "day",
        "per job and iteration: ranks reported, span, slowest rank's duration, compute quantiles, mean "
        "communication, bytes"),
    Rollup("gpu_health_1m", "gpu_health", ("node", "gpu", "minute"), _cols(
        f"`minute` DateTime CODEC({TIME_CODEC})",
        "`node` LowCardinality(String)",
        "`gpu` UInt8",
        "`samples` SimpleAggregateFunction(sum, UInt64)",
        "`lost_samples` SimpleAggregateFunction(sum, UInt64)",
        "`throttled_samples` SimpleAggregateFunction(sum, UInt64)",
        "`mean_temperature_c` AggregateFunction(avg, Nullable(Float64))",
        "`max_temperature_c` SimpleAggregateFunction(max, Nullable(Float64))",
        "`max_power_w` SimpleAggregateFunction(max, Nullable(Float64))",
        "`min_sm_clock_mhz` SimpleAggregateFunction(min, Nullable(UInt32))",
        "`mean_gpu_util_pct` AggregateFunction(avg, Nullable(UInt8))",
        "`max_xid` SimpleAggregateFunction(max, UInt32)",
        "`max_ecc_corrected` SimpleAggregateFunction(max, Nullable(UInt64))",
        "`max_ecc_uncorrected` SimpleAggregateFunction(max, Nullable(UInt64))",
        "`max_retired_pages` SimpleAggregateFunction(max, Nullable(UInt64))"),
        """SELECT toStartOfMinute(time) AS minute, node, gpu, count() AS samples, countIf(lost) AS lost_samples,
  countIf(length(throttle) > 0) AS throttled_samples, avgState(temperature_c) AS mean_temperature_c,
  max(temperature_c) AS max_temperature_c, max(power_w) AS max_power_w, min(sm_clock_mhz) AS min_sm_clock_mhz,
  avgState(gpu_util_pct) AS mean_gpu_util_pct, max(xid) AS max_xid, max(ecc_corrected) AS max_ecc_corrected,
  max(ecc_uncorrected) AS max_ecc_uncorrected, max(retired_pages) AS max_retired_pages""", "minute",
        "per GPU and minute: samples, lost and throttled samples, mean and max temperature, max power, lowest SM "
        "clock, mean utilization, worst XID, the ECC and retired-page counters"),
    Rollup("node_last_seen", "heartbeats", ("node",), _cols(
        "`node` LowCardinality(String)",
        "`last_seen` SimpleAggregateFunction(max, DateTime64(9))",
        "`heartbeats` SimpleAggregateFunction(sum, UInt64)"),
        """SELECT node, max(time) AS last_seen, count() AS heartbeats""", "toDateTime(last_seen)",
        "per node: its last heartbeat (what the silent-node alert reads: one row per node, not five a second)",
        migration=4),
    Rollup("link_availability_1m", "link_states", ("node", "interface", "minute"), _cols(
        f"`minute` DateTime CODEC({TIME_CODEC})",
        "`node` LowCardinality(String)",
        "`interface` LowCardinality(String)",
        "`samples` SimpleAggregateFunction(sum, UInt64)",
        "`up_samples` SimpleAggregateFunction(sum, UInt64)",
        "`min_carrier_changes` SimpleAggregateFunction(min, UInt64)",
        "`max_carrier_changes` SimpleAggregateFunction(max, UInt64)"),
        """SELECT toStartOfMinute(time) AS minute, node, interface, count() AS samples,
  countIf(up AND carrier) AS up_samples, min(carrier_changes) AS min_carrier_changes,
  max(carrier_changes) AS max_carrier_changes""", "minute",
        "per port and minute: samples, samples up with carrier (availability = up_samples / samples), and the "
        "carrier counter's lowest and highest value (flaps in the minute = max - min)"),
)
