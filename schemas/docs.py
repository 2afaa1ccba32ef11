"""Markdown reference for the topics and tables, generated from the models (`python -m clocktower.schemas.docs`)."""

from __future__ import annotations

import inspect
import json
from typing import Any

from clocktower.schemas.clickhouse_ddl import KAFKA_COLUMNS
from clocktower.schemas.codec import DEFAULT_MAX_FUTURE_SKEW_NS, H_COUNT, H_SCHEMA, H_VERSION
from clocktower.schemas.columns import model_columns
from clocktower.schemas.event import Event
from clocktower.schemas.json_schema import H_RID
from clocktower.schemas.topics import MAX_MESSAGE_BYTES, MAX_RECORD_BYTES, RECORD_OVERHEAD_BYTES, TOPICS


def _envelope_rules() -> list[str]:
    """What a producer's records must satisfy (schemas/topics.py, schemas/envelope_checks.py), for third parties."""
    return [
        f"Record size: a record's value is at most {MAX_RECORD_BYTES} bytes (`MAX_RECORD_BYTES`, uncompressed JSON). "
        f"The topics are created with `max.message.bytes` {MAX_MESSAGE_BYTES} (the value plus "
        f"{RECORD_OVERHEAD_BYTES // 1024} KiB for key, headers and framing), and an existing topic's lower limit is "
        "raised at start where the broker allows it. clocktower's publisher cuts a bigger batch into several records, "
        "each a complete envelope, and refuses (logs and counts) a single event that alone exceeds the limit.",
        "",
        "A record is dead-lettered, with the reason, when: it has no key, or an event's `node` differs from the key; "
        f"`{H_COUNT}` is missing or differs from the number of events in the value; an event's `ts_ns` (on "
        "`telemetry.*` topics, any of its timestamp fields) is more than `CLOCKTOWER_MAX_FUTURE_SKEW_S` "
        f"(default {DEFAULT_MAX_FUTURE_SKEW_NS // 10**9} s) ahead of the decoding service's clock; or it fails any "
        "other check below (schema, version, field types and bounds). Topics are not auto-created: the embedded "
        "broker has `auto.create.topics.enable` off and the publisher refuses a topic not listed here.",
    ]


def _record_id() -> list[str]:
    """The optional `ct-rid` header: who sets it, who reads it, and that the sink does not dedup by it."""
    return [
        f"`{H_RID}` (optional): a record id, `<publisher instance>-<sequence number>`, unique per record, that "
        "clocktower's spooling publisher (producers/spooling_publisher.py: the node agent and the PyTorch hooks; "
        "the simulator and the clock-probe agent publish without it) adds to every record it sends. Only that "
        "publisher reads it: before replaying its spool after an outage or a restart it reads the topics back "
        "from the oldest record in doubt and does not resend a record "
        f"whose `{H_RID}` is already there. Decoders ignore it, and the ClickHouse sink does not dedup by it: its "
        "insert dedup token (`insert_deduplication_token`) is the topic, partition, first and last offset, row count "
        "and a digest of the records' values, plus a salt renewed per sink process and after every delete "
        "(sinks/clickhouse/partition_batch.py), so a retried insert is dropped, and rows are exactly-once by offset. "
        "A record sent twice (with the same id) by a producer without that check is stored twice. "
        "JSON Schemas of the envelope and of every event type are in `docs/schemas/` (also `make docs`).",
    ]


def _number(v: int | float) -> str:
    if isinstance(v, int) and v > 2**16 and (v + 1) & v == 0:
        return f"2^{(v + 1).bit_length() - 1}-1"
    return f"{v}"


def _allowed(prop: dict[str, Any]) -> str:
    """The values a field's JSON Schema allows, in a few words."""
    alts = prop.get("anyOf", [prop])
    words = [_allowed_one(a) for a in alts if a.get("type") != "null"]
    return " or ".join(words) + (" or null" if len(alts) > len(words) else "")


def _allowed_one(p: dict[str, Any]) -> str:
    if "enum" in p or "const" in p:
        return ", ".join(f"`{v}`" for v in p.get("enum", [p.get("const")]))
    kind = p.get("type")
    if kind == "array":
        n = f", at most {p['maxItems']}" if "maxItems" in p else ""
        return f"list of ({_allowed(p['items'])}){n}"
    if kind == "object":
        n = f", at most {p['maxProperties']}" if "maxProperties" in p else ""
        return f"map of string to ({_allowed(p.get('additionalProperties', {}))}){n}"
    if kind == "string":
        lo, hi = p.get("minLength", 0), p.get("maxLength")
        return f"string, {lo}..{hi} chars" if hi is not None else "string"
    if kind in ("integer", "number"):
        if p.get("minimum") == 946_684_800 * 10**9 and p.get("maximum") == 4_102_444_800 * 10**9:
            return "ns since the epoch, 2000-01-01..2100-01-01"
        word = "integer" if kind == "integer" else "finite number"
        if "minimum" in p or "maximum" in p:
            return f"{word} {_number(p.get('minimum', '-inf'))}..{_number(p.get('maximum', 'inf'))}"
        return word
    return str(kind)


def _required(model: type[Event], name: str) -> str:
    field = model.model_fields[name]
    if field.is_required():
        return "yes"
    when = [f"`{k}` = `{v}`" for (k, v), fields in model.REQUIRED_WHEN.items() if name in fields]
    default = json.dumps(field.default_factory()) if field.default_factory is not None else json.dumps(field.default)
    return (f"when {' or '.join(when)}; else " if when else "no, ") + f"`{default}`"


def _field_rows(model: type[Event]) -> list[str]:
    props = model.model_json_schema()["properties"]
    rows = ["| column | ClickHouse type | required | allowed values | meaning |", "|---|---|---|---|---|"]
    for c in model_columns(model):
        desc = (props[c.name].get("description") or "").replace("|", "\\|").replace("\n", " ")
        rows.append(f"| `{c.name}` | {c.ch_type} | {_required(model, c.name)} | {_allowed(props[c.name])} | {desc} |")
    return rows


def render() -> str:
    out = [
        "# Topics and tables",
        "",
        "Generated by `make docs` from `schemas/`; do not edit by hand.",
        "",
        "Every Kafka record is a batch of events of one schema from one node: key = node id, "
        f"headers `{H_SCHEMA}`, `{H_VERSION}`, `{H_COUNT}`, value = a JSON array of events "
        f"(at most {MAX_RECORD_BYTES // 2**20} MiB). Each topic lands in one ClickHouse table with the "
        "model's columns plus " + ", ".join(f"`{n}` {t}" for n, t in KAFKA_COLUMNS)
        + " (the Kafka origin; `_node_mac`: whether the node the record names signed it: `valid`, `none`, "
        "`invalid`, or `unchecked` where nodes sign nothing or the sink has no producer key) and `time` "
        "DateTime64(9) (from `ts_ns`).",
        "",
        *_envelope_rules(),
        "",
        *_record_id(),
        "",
        "Field tables: *required* `yes` means a record without that field is a dead letter (a missing "
        "measurement is never stored as 0); a default is used only where it is a true value or where the field "
        "does not apply to that kind of record. *null* means no reading (NULL in ClickHouse).",
        "",
        "| topic | schema | table | partitions | retention (days) | what |",
        "|---|---|---|---|---|---|",
    ]
    for t in TOPICS:
        out.append(f"| `{t.name}` | `{t.model.SCHEMA}` v{t.model.VERSION} | `{t.table}` | {t.partitions} "
                   f"| {t.retention_days} | {t.description} |")
    for t in TOPICS:
        doc = inspect.cleandoc(t.model.__doc__ or "")
        out += ["", f"## `{t.table}` (topic `{t.name}`)", "", doc, "", *_field_rows(t.model)]
        key = "Natural key (ReplacingMergeTree: duplicates collapse, read with FINAL)" if t.model.REPLACING \
            else "Sorting key"
        out.append(f"\n{key}: `({', '.join(t.model.ORDER_BY)})`")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(render(), end="")
