"""Versioned migrations, codecs, rollups and the cluster DDL, against the real engine.

An old data dir (tables as the first versions made them: no codecs, no `time`, no rollups) is migrated with its
rows kept; a second start changes nothing; a migration cut short is run again. The cluster mode's statements are
parsed by the engine's own parser (formatQuery: a cluster with Keeper cannot run here). The rollups are compared
with the same aggregates computed from the raw rows of a simulated run.
"""

from __future__ import annotations

import re
import time

import pytest

from clocktower.schemas.clickhouse_ddl import Layout, create_table_sql, without_codecs
from clocktower.schemas.columns import model_columns
from clocktower.schemas.migrations import BOOKKEEPING, MIGRATIONS, fresh_install_sql, reconcile_columns_sql
from clocktower.schemas.rollups import ROLLUPS
from clocktower.schemas.telemetry import GpuHealth
from clocktower.schemas.topics import BY_MODEL, TOPICS
from clocktower.sinks.clickhouse.batch_set import BatchSet
from clocktower.sinks.clickhouse.migrator import Migrator
from clocktower.sinks.clickhouse.table_writer import TableWriter
from tests.event_samples import SAMPLES

CLUSTER = Layout(cluster="fleet")
DESTRUCTIVE = re.compile(r"\b(DROP|TRUNCATE|DELETE|DETACH|RENAME|REPLACE\s+TABLE|EXCHANGE|MOVE)\b", re.IGNORECASE)


def _old_version_ddl(spec) -> str:  # noqa: ANN001
    """The table as the first versions made it: no codecs, no `time` view, no `_topic` or `_node_mac`."""
    ddl = without_codecs(create_table_sql(spec)[0])
    ddl = re.sub(r"\n    `(_topic|_node_mac)` [^\n]*", "", ddl)
    ddl = re.sub(r",\n    `time` DateTime64\(9\) MATERIALIZED [^\n]*", "", ddl)
    return re.sub(r"\nTTL [^\n]*", "", ddl)


def _codecs(client, table: str) -> dict[str, str]:  # noqa: ANN001
    rows = client.query("SELECT name, compression_codec FROM system.columns WHERE database = currentDatabase() "
                        "AND table = {t:String}", parameters={"t": table}).result_rows
    return {name: re.sub(r"\b(Delta|DoubleDelta)\(\d+\)", r"\1", codec) for name, codec in rows}   # Delta(8): Delta


def test_an_old_data_dir_is_migrated_keeping_every_row_and_a_second_start_changes_nothing(services) -> None:
    client = services.client
    for spec in TOPICS:
        client.command(_old_version_ddl(spec))
    writer = TableWriter(client)
    batches = BatchSet()
    batches.add("telemetry.gpu", 0, 0, [GpuHealth(**SAMPLES["gpu_health"])])
    old = batches.take()[0][0].to_arrow()
    client.insert_arrow("gpu_health", old.drop_columns(["_topic", "_node_mac"]))
    assert _codecs(client, "gpu_health")["ts_ns"] == ""

    assert writer.ensure_schema() == [m.version for m in MIGRATIONS]
    assert client.query("SELECT count(), any(toUnixTimestamp64Nano(time)) = any(ts_ns), any(_topic), any(_node_mac) "
                        "FROM gpu_health").result_rows == [(1, True, "telemetry.gpu", "unchecked")]
    codecs = _codecs(client, "gpu_health")
    assert codecs["ts_ns"] == "CODEC(Delta, ZSTD(1))" and codecs["temperature_c"] == "CODEC(ZSTD(1))"
    assert codecs["time"] == "CODEC(Delta, ZSTD(1))"
    tables = {r[0] for r in client.query("SHOW TABLES").result_rows}
    assert {r.name for r in ROLLUPS} | {f"{r.name}_mv" for r in ROLLUPS} <= tables

    assert writer.ensure_schema() == []   # a second start: every migration recorded, nothing to do
    recorded = client.query(f"SELECT version, name FROM {BOOKKEEPING} FINAL ORDER BY version").result_rows
    assert recorded == [(m.version, m.name) for m in MIGRATIONS]
    batches.add("telemetry.gpu", 0, 1, [GpuHealth(**{**SAMPLES["gpu_health"], "ts_ns": time.time_ns()})])
    client.insert_arrow("gpu_health", batches.take()[0][0].to_arrow())
    assert client.query("SELECT sum(samples) FROM gpu_health_1m").result_rows == [(1,)]   # the view feeds it


def test_a_migration_cut_short_is_run_again_to_the_end(services) -> None:
    client = services.client
    migrator = Migrator(client)
    migrator.run()
    client.command(f"ALTER TABLE {BOOKKEEPING} DELETE WHERE version = 3 SETTINGS mutations_sync = 1")
    client.command("DROP VIEW gpu_health_1m_mv")   # as if the crash came before its last statements
    assert migrator.run() == [3]
    assert "gpu_health_1m_mv" in {r[0] for r in client.query("SHOW TABLES").result_rows}


@pytest.mark.parametrize("layout", [Layout(), CLUSTER], ids=["one-server", "cluster"])
def test_no_statement_drops_or_rewrites_data(layout: Layout) -> None:
    old_catalog = {layout.storage(s.table): {c.name: (c.ch_type, "") for c in model_columns(s.model)}
                   for s in TOPICS}
    statements = fresh_install_sql(layout) + reconcile_columns_sql(layout, old_catalog)
    statements += [sql for m in MIGRATIONS for sql in m.statements(layout, old_catalog)]
    assert statements and not [s for s in statements if DESTRUCTIVE.search(s)]


def test_the_cluster_ddl_parses_with_the_engines_parser_and_keeps_the_sinks_table_names(services) -> None:
    client = services.client
    old_catalog = {CLUSTER.storage(s.table): {c.name: (c.ch_type, "") for c in model_columns(s.model)}
                   for s in TOPICS}
    statements = fresh_install_sql(CLUSTER) + [sql for m in MIGRATIONS for sql in m.statements(CLUSTER, old_catalog)]
    statements += reconcile_columns_sql(CLUSTER, {t: dict(list(cols.items())[:2]) for t, cols in old_catalog.items()})
    formatted = [client.query("SELECT formatQuery({q:String})", parameters={"q": sql}).result_rows[0][0]
                 for sql in statements]
    assert all(" ON CLUSTER fleet" in f for f in formatted)
    creates = {re.search(r"CREATE (?:TABLE|MATERIALIZED VIEW) IF NOT EXISTS default\.(\w+)", f).group(1): f
               for f in formatted if f.startswith("CREATE")}
    for spec in TOPICS:
        local, front = creates[f"{spec.table}_local"], creates[spec.table]
        engine = "ReplicatedReplacingMergeTree" if spec.model.REPLACING else "ReplicatedMergeTree"
        assert f"ENGINE = {engine}('/clickhouse/tables/{{shard}}/{{database}}/{{table}}', '{{replica}}')" in local
        assert f"ENGINE = Distributed(fleet, default, {spec.table}_local, cityHash64(" in front, front
    for r in ROLLUPS:
        assert "ReplicatedAggregatingMergeTree" in creates[f"{r.name}_local"]
        assert f"FROM default.{r.source}_local" in creates[f"{r.name}_local_mv"]
        assert f"Distributed(fleet, default, {r.name}_local" in creates[r.name]
    # replaced rows are sharded by their replacing key, so FINAL finds a row's versions on one shard
    incidents = creates["incidents"]
    assert "cityHash64(incident_id, state, ts_ns)" in incidents


def test_a_ddl_the_parser_refuses_fails_the_check(services) -> None:
    from clickhouse_connect.driver.exceptions import DatabaseError

    with pytest.raises(DatabaseError, match="SYNTAX_ERROR|Syntax error"):
        services.client.query("SELECT formatQuery({q:String})",
                              parameters={"q": create_table_sql(BY_MODEL[GpuHealth], CLUSTER)[0][:-40]})


# The rollups against the raw rows they summarize (the session's simulated run).

def _one(client, sql: str):  # noqa: ANN001, ANN202
    return client.query(sql).result_rows


def test_gpu_health_rollup_matches_the_raw_rows(simulated_fleet) -> None:
    c = simulated_fleet.admin
    raw = _one(c, """SELECT node, gpu, toStartOfMinute(time) AS m, count(), max(temperature_c),
                       round(avg(temperature_c), 6), min(sm_clock_mhz), countIf(lost),
                       countIf(length(throttle) > 0), max(xid)
                     FROM gpu_health GROUP BY node, gpu, m ORDER BY node, gpu, m""")
    rolled = _one(c, """SELECT node, gpu, minute, sum(samples), max(max_temperature_c),
                          round(avgMerge(mean_temperature_c), 6), min(min_sm_clock_mhz), sum(lost_samples),
                          sum(throttled_samples), max(max_xid)
                        FROM gpu_health_1m GROUP BY node, gpu, minute ORDER BY node, gpu, minute""")
    assert len(raw) >= 32 and rolled == raw
    assert any(r[7] for r in raw) and any(r[9] for r in raw)   # the run lost a GPU and raised XIDs


def test_link_availability_rollup_matches_the_raw_rows(simulated_fleet) -> None:
    c = simulated_fleet.admin
    raw = _one(c, """SELECT node, interface, toStartOfMinute(time) AS m, count(), countIf(up AND carrier),
                       max(carrier_changes) - min(carrier_changes)
                     FROM link_states GROUP BY node, interface, m ORDER BY node, interface, m""")
    rolled = _one(c, """SELECT node, interface, minute, sum(samples), sum(up_samples),
                          max(max_carrier_changes) - min(min_carrier_changes)
                        FROM link_availability_1m GROUP BY node, interface, minute ORDER BY node, interface, minute""")
    assert rolled == raw and any(r[3] != r[4] for r in raw) and any(r[5] for r in raw)   # a flapping port


def test_iteration_stats_rollup_matches_the_raw_rows(simulated_fleet) -> None:
    c = simulated_fleet.admin
    raw = _one(c, """SELECT job, iteration, count(), min(start_ns), max(end_ns), max(duration_ns), max(compute_ns),
                       sum(comm_bytes), round(avg(comm_ns))
                     FROM iteration_breakdown GROUP BY job, iteration ORDER BY job, iteration""")
    rolled = _one(c, """SELECT job, iteration, sum(ranks), min(first_start_ns), max(last_end_ns), max(max_duration_ns),
                          max(max_compute_ns), sum(total_comm_bytes), round(avgMerge(mean_comm_ns))
                        FROM iteration_stats GROUP BY job, iteration ORDER BY job, iteration""")
    assert len(raw) > 50 and rolled == raw


def test_latency_rollup_counts_every_packet_and_its_quantiles_are_close_to_the_exact_ones(simulated_fleet) -> None:
    c = simulated_fleet.admin
    delay = "if(clock_corrected, assumeNotNull(corrected_latency_ns), latency_ns)"
    raw = _one(c, f"""SELECT src_node, node, count(), countIf(clock_corrected), quantilesExact(0.5, 0.99)({delay})
                      FROM flow_latency GROUP BY src_node, node ORDER BY src_node, node""")
    rolled = _one(c, """SELECT src_node, node, sum(packets), sum(corrected), quantilesTDigestMerge(0.5, 0.9, 0.99)(
                          delay_quantiles_ns)
                        FROM flow_latency_1m GROUP BY src_node, node ORDER BY src_node, node""")
    assert [r[:4] for r in rolled] == [r[:4] for r in raw] and len(raw) >= 4
    for (*_, exact), (*_, digest) in zip(raw, rolled, strict=True):
        assert abs(digest[0] - exact[0]) <= 0.05 * exact[0] and abs(digest[2] - exact[1]) <= 0.15 * exact[1]


def test_clocktower_schema_prints_the_statements_a_start_runs_and_refuses_a_bad_name(capsys) -> None:
    from clocktower.cli import main

    assert main(["schema", "--cluster", "fleet"]) == 0
    out = capsys.readouterr().out
    assert out.rstrip().removesuffix(";").split(";\n\n") == fresh_install_sql(CLUSTER)
    assert main(["schema", "--cluster", "fleet; DROP TABLE x"]) == 2
    assert "letters, digits and _" in capsys.readouterr().err


def test_the_sink_deletes_lost_records_from_every_shard_s_local_table_on_a_cluster(services) -> None:
    from clocktower.sinks.clickhouse.table_writer import TableWriter as Writer

    where = "`_topic` = 'telemetry.gpu' AND `_partition` = 0 AND `_offset` >= 5"
    sql = Writer(services.client, layout=CLUSTER).delete_sql("gpu_health", where)
    assert sql == f"ALTER TABLE default.`gpu_health_local` ON CLUSTER fleet DELETE WHERE {where}"
    services.client.query("SELECT formatQuery({q:String})", parameters={"q": sql})   # parses
    assert Writer(services.client).delete_sql("gpu_health", where) == \
        f"ALTER TABLE default.`gpu_health` DELETE WHERE {where}"


def test_cluster_reconcile_judges_each_table_by_its_own_columns_and_puts_codecs_on_local_tables_only() -> None:
    """The local table complete, the Distributed one missing a column and with a reading not yet nullable (an
    ALTER that failed there last time): only the Distributed table is altered, database-qualified, with no CODEC."""
    from clocktower.schemas.clickhouse_ddl import add_missing_columns_sql

    spec = BY_MODEL[GpuHealth]
    full = {c.name: (c.ch_type, "CODEC(ZSTD(1))") for c in model_columns(GpuHealth)} | {"time": ("DateTime64(9)", "")}
    front = {k: v for k, v in full.items() if k != "xid"}
    front["temperature_c"] = ("Float64", "")
    catalog = {"gpu_health_local": full, "gpu_health": front}
    statements = [s for s in reconcile_columns_sql(CLUSTER, catalog) if "gpu_health" in s]
    assert len(statements) == 2 and all(s.startswith("ALTER TABLE default.`gpu_health` ON CLUSTER fleet ")
                                        for s in statements), statements
    assert "ADD COLUMN IF NOT EXISTS `xid` UInt32" in statements[0] and "CODEC" not in statements[0]
    assert statements[1] == "ALTER TABLE default.`gpu_health` ON CLUSTER fleet MODIFY COLUMN `temperature_c` " \
                            "Nullable(Float64)"
    local = add_missing_columns_sql(spec, set(front), CLUSTER, "gpu_health_local")
    assert local[0].startswith("ALTER TABLE default.`gpu_health_local` ON CLUSTER fleet ADD COLUMN IF NOT EXISTS "
                               "`xid` UInt32") and local[0].rstrip().split(" AFTER ")[0].endswith("CODEC(ZSTD(1))")


def test_node_last_seen_rollup_holds_each_node_s_last_heartbeat(simulated_fleet) -> None:
    c = simulated_fleet.admin
    raw = _one(c, "SELECT node, max(time), count() FROM heartbeats GROUP BY node ORDER BY node")
    rolled = _one(c, "SELECT node, max(last_seen), sum(heartbeats) FROM node_last_seen GROUP BY node ORDER BY node")
    assert len(raw) == 4 and rolled == raw
