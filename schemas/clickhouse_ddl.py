"""ClickHouse DDL generated from the topic registry and the event models.

Every table gets the model's columns plus the Kafka origin of each row
(`_partition`, `_offset`, `_topic`): the sink resumes each (topic, partition)
from its highest stored offset, which makes a crash-and-replay double nothing. `_node_mac` says whether the
record was signed by the node it names (schemas/record_mac.py): `valid`, `none` (unsigned), `invalid` (another
node's key, or altered), or `unchecked` (a topic nodes do not sign, or the sink has no producer key); rows from
records no key vouches for are stored and shown, flagged, and the streams act on none of them. `time` is a
DateTime64(9) view of `ts_ns` for Grafana and humans.
"""

from __future__ import annotations

from clocktower.schemas.columns import model_columns
from clocktower.schemas.topics import TOPICS, TopicSpec

DEDUP_WINDOW = 10_000
KAFKA_COLUMNS = (("_partition", "UInt32"), ("_offset", "Int64"), ("_topic", "LowCardinality(String)"),
                 ("_node_mac", "LowCardinality(String)"))


def create_table_sql(spec: TopicSpec, database: str = "default") -> str:
    cols = [f"    `{c.name}` {c.ch_type}" for c in model_columns(spec.model)]
    cols += [f"    `{name}` {typ}" for name, typ in KAFKA_COLUMNS]
    cols.append("    `time` DateTime64(9) MATERIALIZED fromUnixTimestamp64Nano(ts_ns)")
    engine = "ReplacingMergeTree" if spec.model.REPLACING else "MergeTree"
    ttl = f"\nTTL toDateTime(time) + INTERVAL {spec.retention_days} DAY" if spec.name != "deadletter" else ""
    order = ", ".join(spec.model.ORDER_BY)
    return (
        f"CREATE TABLE IF NOT EXISTS {database}.`{spec.table}`\n(\n" + ",\n".join(cols) + "\n)\n"
        f"ENGINE = {engine}\nORDER BY ({order}){ttl}\n"
        f"SETTINGS non_replicated_deduplication_window = {DEDUP_WINDOW}"
    )


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


def add_missing_columns_sql(spec: TopicSpec, existing: set[str]) -> list[str]:
    """ALTERs that give a table made by an older version the model's columns it lacks (tables are created
    only when missing, so a new field would otherwise fail every insert into an old data dir)."""
    out, prev = [], None
    for c in model_columns(spec.model):
        if c.name not in existing:
            where = f" AFTER `{prev}`" if prev else " FIRST"
            out.append(f"ALTER TABLE `{spec.table}` ADD COLUMN IF NOT EXISTS `{c.name}` {c.ch_type}"
                       f"{_default_sql(spec, c.name)}{where}")
        prev = c.name
    return out


def nullable_upgrade_sql(spec: TopicSpec, types: dict[str, str]) -> list[str]:
    """ALTERs that make nullable the columns of an older table whose model field became nullable (GpuHealth's
    readings: null = not read). Without them ClickHouse would store a null as 0, the fake reading they replace."""
    return [f"ALTER TABLE `{spec.table}` MODIFY COLUMN `{c.name}` {c.ch_type}" for c in model_columns(spec.model)
            if c.name in types and c.ch_type == f"Nullable({types[c.name]})"]


def all_ddl(database: str = "default") -> list[str]:
    """Every CREATE statement, in registry order."""
    return [create_table_sql(t, database) for t in TOPICS]
