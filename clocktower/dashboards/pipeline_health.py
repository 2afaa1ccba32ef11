"""Pipeline health: is every table being written, how fresh is it, and what was dead-lettered."""

from __future__ import annotations

from clocktower.dashboards.layout import Dashboard, Panel
from clocktower.schemas.topics import TOPICS

# Every table the models make; a table whose rows a redelivery writes again is read FINAL, each row once.
TABLES = tuple((t.table, " FINAL" if t.model.REPLACING else "") for t in TOPICS)


def _each_table(select: str) -> str:
    """`select` (with {table} and {final}) over every table the models make, as one UNION ALL."""
    return "\nUNION ALL\n".join(select.format(table=t, final=final) for t, final in TABLES)


DASHBOARD = Dashboard(
    uid="clocktower-pipeline", title="clocktower: pipeline health",
    question="Is every stage writing, how far behind is each table, and what did the pipeline refuse to store?",
    variables=("cluster", "prometheus"),
    panels=(
        Panel("Consumer lag by group (records)", "", unit="short", promql=(
            ("sum by (group) (clocktower_consumer_lag_records)", "{{group}}"),),
              description="What each consumer group has yet to commit (the sink's and the streams' own exports)."),
        Panel("Events per second, by stage", "", unit="short", promql=(
            ("sum(rate(clocktower_agent_events_total[1m]))", "agents, to Kafka"),
            ("sum(rate(clocktower_streams_records_total[1m]))", "streams, read"),
            ("sum(rate(clocktower_sink_records_total[1m]))", "sink, read"),
            ("sum(rate(clocktower_sink_rows_total[1m]))", "sink, rows stored")),
              description="Each stage's rate: a stage that falls behind the one before it builds lag."),
        Panel("Dead letters and errors per second", "", unit="short", promql=(
            ("sum by (topic) (rate(clocktower_sink_deadletters_total[5m]))", "sink dead letters {{topic}}"),
            ("sum(rate(clocktower_streams_decode_failures_total[5m]))", "streams decode failures"),
            ("sum(rate(clocktower_streams_batch_failures_total[5m]))", "streams batch failures"),
            ("sum(rate(clocktower_agent_events_dropped_total[5m]))", "agent events dropped"),
            ("sum by (group) (rate(clocktower_consumer_lag_read_errors_total[5m]))", "lag not read {{group}}"))),
        Panel("Agent spool depth per node (records)", "", unit="short", promql=(
            ("clocktower_agent_spool_records", "{{instance}}"),),
              description="Records an agent holds on disk while the broker is away; they drain when it is back."),
        Panel("Command to ack p99, by action (s)", "", unit="s", promql=(
            ("histogram_quantile(0.99, sum by (le, action) (rate(clocktower_actuator_command_to_ack_seconds_bucket[5m])))",
             "{{action}}"),
            ("histogram_quantile(0.99, sum by (le, action) (rate(clocktower_actuator_apply_seconds_bucket[5m])))",
             "apply {{action}}")),
              description="From the command's signing to the node's ack (two machines' clocks), and the apply time."),
        Panel("Acks per second, by status", "", unit="short", promql=(
            ("sum by (status) (rate(clocktower_actuator_commands_total[5m]))", "{{status}}"),)),
        Panel("Sink insert time p99 (s)", "", unit="s", promql=(
            ("histogram_quantile(0.99, sum by (le) (rate(clocktower_sink_flush_seconds_bucket[5m])))", "p99"),)),
        Panel("Freshness per table", "SELECT * FROM (\n" + _each_table(
            "SELECT '{table}' AS table_name, maxOrNull(time) AS newest, count() AS rows_in_range FROM {table}{final} "
            "WHERE $__timeFilter(time)") + "\n) ORDER BY newest NULLS FIRST", kind="table", width=12, height=10,
              description="The newest row of each table in the time range: a stage that stopped shows here first."),
        Panel("Rows written per second, by table", "SELECT t, table_name, rows / $__interval_s AS rows_per_s FROM (\n"
              + _each_table("SELECT $__timeInterval(time) AS t, '{table}' AS table_name, count() AS rows "
                            "FROM {table}{final} WHERE $__timeFilter(time) GROUP BY t") + "\n) ORDER BY t",
              width=12, height=10),
        Panel("Dead letters per interval, by topic and detector", """SELECT $__timeInterval(time) AS t, concat(origin_topic, if(detector = '', '', concat(' / ', detector))) AS source,
  count() AS dead_letters
FROM deadletter FINAL
WHERE $__timeFilter(time)
GROUP BY t, source ORDER BY t""", may_be_empty="a clean simulated run dead-letters nothing"),
        Panel("Dead letters", """SELECT time, origin_topic, origin_partition, origin_offset, detector, reason
FROM deadletter FINAL
WHERE $__timeFilter(time)
ORDER BY time DESC LIMIT 100""", kind="table", may_be_empty="a clean simulated run dead-letters nothing"),
        Panel("Stream worker ticks per second", """SELECT $__timeInterval(time) AS t, node AS worker, count() / $__interval_s AS ticks_per_s
FROM streams_ticks
WHERE $__timeFilter(time)
GROUP BY t, worker ORDER BY t""", description="Each stream worker's timer: a gap is a stalled worker.",
              may_be_empty="the ticks are the Faust workers' own; the in-memory processors have none"),
        Panel("Rows stored per table", """SELECT table, sum(rows) AS rows, formatReadableSize(sum(bytes_on_disk)) AS on_disk
FROM system.parts WHERE active AND database = currentDatabase() GROUP BY table ORDER BY table""", kind="table"),
    ),
)
