"""ClickHouse DDL generated from the topic registry and the event models, for one server or a cluster.

Every table gets the model's columns plus the Kafka origin of each row
(`_partition`, `_offset`, `_topic`): the sink resumes each (topic, partition)
from its highest stored offset, which makes a crash-and-replay double nothing. `_node_mac` says whether the
record was signed by the node it names (schemas/record_mac.py): `valid`, `none` (unsigned), `invalid` (another
node's key, or altered), or `unchecked` (a topic nodes do not sign, or the sink has no producer key); rows from
records no key vouches for are stored and shown, flagged, and the streams act on none of them. `time` is a
DateTime64(9) view of `ts_ns` for Grafana and humans. Each column carries its model's codec (column_types.Codec).

On a cluster (`Layout.cluster`), each table's rows live in `<table>_local` (Replicated*MergeTree, ON CLUSTER) and
`<table>` is a Distributed table over them, so the sink, the dashboards and the CLI use the same names. Rows
that replace each other are sharded by their replacing key, so FINAL meets them on one shard; the others by node.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from clocktower.schemas.column_types import DEFAULT_CODEC, TIME_CODEC
from clocktower.schemas.columns import model_columns
from clocktower.schemas.topics import TOPICS, TopicSpec

DEDUP_WINDOW = 10_000
KAFKA_COLUMNS = (("_partition", "UInt32"), ("_offset", "Int64"), ("_topic", "LowCardinality(String)"),
                 ("_node_mac", "LowCardinality(String)"))
REPLICA_PATH = "'/clickhouse/tables/{shard}/{database}/{table}', '{replica}'"   # the server's macros


@dataclass(frozen=True)
class Layout:
    """Where the tables live: one server (`cluster` None), or a cluster named in the servers' remote_servers."""

    database: str = "default"
    cluster: str | None = None

    def __post_init__(self) -> None:
        for name in (self.database, self.cluster or "x"):
            if not name.replace("_", "").isalnum() or not name[0].isalpha():
                raise ValueError(f"{name!r}: a database or cluster name is letters, digits and _, starting a letter")

    @property
    def on_cluster(self) -> str:
        return f" ON CLUSTER {self.cluster}" if self.cluster else ""

    def storage(self, table: str) -> str:
        """The table that holds the rows: `<table>_local` on a cluster, the table itself on one server."""
        return f"{table}_local" if self.cluster else table

    def engine(self, kind: str) -> str:
        """`kind` (MergeTree, ReplacingMergeTree, AggregatingMergeTree), replicated on a cluster."""
        return f"Replicated{kind}({REPLICA_PATH})" if self.cluster else kind

    def dedup_setting(self) -> str:
        """Keep the last DEDUP_WINDOW insert tokens: a retried insert of a batch is dropped, not doubled."""
        prefix = "replicated" if self.cluster else "non_replicated"
        return f"{prefix}_deduplication_window = {DEDUP_WINDOW}"

    def distributed_sql(self, table: str, sharding_key: str) -> list[str]:
        """On a cluster, the Distributed table named `table` over every shard's `<table>_local`."""
        if not self.cluster:
            return []
        return [f"CREATE TABLE IF NOT EXISTS {self.database}.`{table}`{self.on_cluster} AS "
                f"{self.database}.`{self.storage(table)}`\nENGINE = Distributed({self.cluster}, {self.database}, "
                f"{self.storage(table)}, {sharding_key})"]

    def alter_targets(self, table: str) -> list[str]:
        """The tables an added column goes to: the local one and, on a cluster, the Distributed one too."""
        return [self.storage(table), table] if self.cluster else [table]

    def qualified(self, table: str) -> str:
        return f"{self.database}.`{table}`"


ONE_SERVER = Layout()


def sharding_key(spec: TopicSpec) -> str:
    """Replaced rows by their key (FINAL must see them on one shard); the rest by node, keeping a node's together."""
    cols = spec.model.ORDER_BY if spec.model.REPLACING else ("node",)
    return f"cityHash64({', '.join(cols)})"


def create_table_sql(spec: TopicSpec, layout: Layout = ONE_SERVER) -> list[str]:
    """The statements that make the table (on a cluster: the local table, then the Distributed one)."""
    cols = [f"    `{c.name}` {c.ch_type} CODEC({c.codec})" for c in model_columns(spec.model)]
    cols += [f"    `{name}` {typ} CODEC({DEFAULT_CODEC})" for name, typ in KAFKA_COLUMNS]
    cols.append(f"    `time` DateTime64(9) MATERIALIZED fromUnixTimestamp64Nano(ts_ns) CODEC({TIME_CODEC})")
    engine = layout.engine("ReplacingMergeTree" if spec.model.REPLACING else "MergeTree")
    ttl = f"\nTTL toDateTime(time) + INTERVAL {spec.retention_days} DAY" if spec.name != "deadletter" else ""
    order = ", ".join(spec.model.ORDER_BY)
    local = (
        f"CREATE TABLE IF NOT EXISTS {layout.database}.`{layout.storage(spec.table)}`{layout.on_cluster}\n(\n"
        + ",\n".join(cols) + "\n)\n"
        f"ENGINE = {engine}\nORDER BY ({order}){ttl}\n"
        f"SETTINGS {layout.dedup_setting()}"
    )
    return [local, *layout.distributed_sql(spec.table, sharding_key(spec))]


def _default_sql(spec: TopicSpec, name: str) -> str:
    """What rows stored before column `name` existed read: the model's COLUMN_DEFAULTS expression, else its
    plain default, else (required or null) the type's default."""
    expr = getattr(spec.model, "COLUMN_DEFAULTS", {}).get(name)
    if expr is not None:
        return f" DEFAULT {expr}"
    default = spec.model.model_fields[name].default
    if isinstance(default, bool):
        return f" DEFAULT {'true' if default else 'false'}"
    if isinstance(default, int | float):
        return f" DEFAULT {default!r}"
    if isinstance(default, str):
        return " DEFAULT '" + default.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return ""


def _codec(layout: Layout, spec: TopicSpec, table: str, codec: str) -> str:
    """A column's CODEC clause on the table holding the rows; none on a Distributed table, which stores nothing."""
    return f" CODEC({codec})" if table == layout.storage(spec.table) else ""


def add_missing_columns_sql(spec: TopicSpec, existing: set[str], layout: Layout = ONE_SERVER,
                            table: str | None = None) -> list[str]:
    """ALTERs that give a table made by an older version the model's columns it lacks (tables are created
    only when missing, so a new field would otherwise fail every insert into an old data dir). `table`: the
    one whose columns `existing` are (on a cluster, the local or the Distributed table; default the local)."""
    table = table or layout.storage(spec.table)
    out, prev = [], None
    for c in model_columns(spec.model):
        if c.name not in existing:
            where = f" AFTER `{prev}`" if prev else " FIRST"
            out.append(f"ALTER TABLE {layout.qualified(table)}{layout.on_cluster} ADD COLUMN IF NOT EXISTS "
                       f"`{c.name}` {c.ch_type}{_default_sql(spec, c.name)}{_codec(layout, spec, table, c.codec)}"
                       f"{where}")
        prev = c.name
    return out


def nullable_upgrade_sql(spec: TopicSpec, types: dict[str, str], layout: Layout = ONE_SERVER,
                         table: str | None = None) -> list[str]:
    """ALTERs that make nullable the columns of an older table whose model field became nullable (GpuHealth's
    readings: null = not read). Without them ClickHouse would store a null as 0, the fake reading they replace."""
    table = table or layout.storage(spec.table)
    return [f"ALTER TABLE {layout.qualified(table)}{layout.on_cluster} MODIFY COLUMN `{c.name}` {c.ch_type}"
            f"{_codec(layout, spec, table, c.codec)}" for c in model_columns(spec.model)
            if c.name in types and c.ch_type == f"Nullable({types[c.name]})"]


def without_codecs(ddl: str) -> str:
    """`ddl` as a version before codecs made it (the storage benchmark's baseline, the migration tests' old tables)."""
    return re.sub(r" CODEC\((?:[^()]|\([^()]*\))*\)", "", ddl)


def all_ddl(layout: Layout = ONE_SERVER) -> list[str]:
    """Every CREATE statement of the topics' tables, in registry order."""
    return [sql for t in TOPICS for sql in create_table_sql(t, layout)]
