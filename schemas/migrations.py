"""The schema's versioned migrations, and the reconciling every start does, as statements from the models.

At every start the sink (sinks/clickhouse/migrator.py) first creates what is missing: the bookkeeping table, and
each topic's table as its model says (new models get their table here). It reconciles columns: a model's new
field is added, a field made nullable is made nullable. Then it runs, in order, each migration whose version the
bookkeeping table lacks, and records it. Columns come from the models; the migrations do what a model
cannot say on its own: what changed for tables an older version made (codecs), and what derives from the tables
(rollups).

Every statement is idempotent (IF NOT EXISTS, or an ALTER that leaves an already-migrated table as it is), so a
migration cut short by a crash is simply run again. None drops or rewrites data: `test_migrations.py` checks
that no statement DROPs, TRUNCATEs, DELETEs or detaches.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from clocktower.schemas.clickhouse_ddl import (
    KAFKA_COLUMNS,
    Layout,
    add_missing_columns_sql,
    all_ddl,
    nullable_upgrade_sql,
)
from clocktower.schemas.column_types import DEFAULT_CODEC, TIME_CODEC
from clocktower.schemas.columns import model_columns
from clocktower.schemas.rollups import ROLLUPS
from clocktower.schemas.sql_literal import quote
from clocktower.schemas.topics import TOPICS

BOOKKEEPING = "clocktower_migrations"

# table -> column -> (type, codec as system.columns shows it: "" when the column has none)
Catalog = Mapping[str, Mapping[str, tuple[str, str]]]


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    statements: Callable[[Layout, Catalog], list[str]]


def _kafka_origin_columns(layout: Layout, catalog: Catalog) -> list[str]:
    """Tables made before rows carried `_topic` (all their rows are from the table's topic) and `_node_mac`
    (unknown: 'unchecked')."""
    out = []
    for spec in TOPICS:
        for t in layout.alter_targets(spec.table):
            codec = f" CODEC({DEFAULT_CODEC})" if t == layout.storage(spec.table) else ""
            out.append(f"ALTER TABLE {layout.qualified(t)}{layout.on_cluster} ADD COLUMN IF NOT EXISTS `_topic` "
                       f"LowCardinality(String) DEFAULT {quote(spec.name)}{codec} AFTER `_offset`")
            out.append(f"ALTER TABLE {layout.qualified(t)}{layout.on_cluster} ADD COLUMN IF NOT EXISTS `_node_mac` "
                       f"LowCardinality(String) DEFAULT 'unchecked'{codec} AFTER `_topic`")
    return out


def _codecs(layout: Layout, catalog: Catalog) -> list[str]:
    """Give the columns of tables made before codecs their model's codec. It applies to the parts written from
    then on, and to older parts as merges rewrite them: nothing is rewritten at once, nothing is lost."""
    out = []
    for spec in TOPICS:
        table = layout.storage(spec.table)
        have = catalog.get(table, {})
        want = {c.name: c.codec for c in model_columns(spec.model)}
        want |= {name: DEFAULT_CODEC for name, _ in KAFKA_COLUMNS} | {"time": TIME_CODEC}
        changes = [f"MODIFY COLUMN `{name}` CODEC({codec})" for name, codec in want.items()
                   if name in have and not have[name][1]]
        if changes:
            out.append(f"ALTER TABLE {layout.qualified(table)}{layout.on_cluster} " + ", ".join(changes))
    return out


def _rollups(version: int) -> Callable[[Layout, Catalog], list[str]]:
    def statements(layout: Layout, catalog: Catalog) -> list[str]:
        return [sql for r in ROLLUPS if r.migration == version for sql in r.create_sql(layout)]
    return statements


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "kafka origin columns on tables made before them", _kafka_origin_columns),
    Migration(2, "column codecs (ZSTD; Delta for timestamps, DoubleDelta for sequences)", _codecs),
    Migration(3, "rollups: per-minute latency, GPU health and link availability; per-iteration job stats",
              _rollups(3)),
    Migration(4, "rollup: each node's last heartbeat", _rollups(4)),
)


def bookkeeping_sql(layout: Layout) -> list[str]:
    """The table that records which migrations ran (ReplacingMergeTree: two sinks starting at once record one)."""
    local = (f"CREATE TABLE IF NOT EXISTS {layout.database}.`{layout.storage(BOOKKEEPING)}`{layout.on_cluster}\n"
             "(\n    `version` UInt32,\n    `name` String,\n    `applied_at` DateTime64(3),\n"
             "    `statements` UInt32,\n    `by` String\n)\n"
             f"ENGINE = {layout.engine('ReplacingMergeTree')}\nORDER BY version")
    return [local, *layout.distributed_sql(BOOKKEEPING, "version")]


def create_sql(layout: Layout) -> list[str]:
    """What every start creates when missing: the bookkeeping table and every topic's table."""
    return bookkeeping_sql(layout) + all_ddl(layout)


def reconcile_columns_sql(layout: Layout, catalog: Catalog) -> list[str]:
    """The models' columns an older table lacks, and fields since made nullable: each table judged by its own
    columns (on a cluster, the local and the Distributed table apart, so one ALTER that failed is done next time)."""
    out = []
    for spec in TOPICS:
        for table in layout.alter_targets(spec.table):
            types = {name: typ for name, (typ, _) in catalog.get(table, {}).items()}
            out += add_missing_columns_sql(spec, set(types), layout, table)
            out += nullable_upgrade_sql(spec, types, layout, table)
            if types and "time" not in types:   # the first versions' tables: the view Grafana and the rollups read
                codec = f" CODEC({TIME_CODEC})" if table == layout.storage(spec.table) else ""
                out.append(f"ALTER TABLE {layout.qualified(table)}{layout.on_cluster} ADD COLUMN IF NOT EXISTS "
                           f"`time` DateTime64(9) MATERIALIZED fromUnixTimestamp64Nano(ts_ns){codec}")
    return out


def fresh_install_sql(layout: Layout) -> list[str]:
    """Every statement a start runs on an empty database, in order (`clocktower schema` prints them)."""
    empty: Catalog = {}
    return create_sql(layout) + [sql for m in MIGRATIONS for sql in m.statements(layout, empty)]
