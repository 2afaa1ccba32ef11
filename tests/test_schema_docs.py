"""docs/SCHEMA.md's field tables say which fields are required and what values they allow (from the models)."""

from __future__ import annotations

from clocktower.schemas.docs import render


def _row(doc: str, table: str, column: str) -> list[str]:
    section = doc.split(f"## `{table}` ")[1].split("\n## ")[0]
    line = next(x for x in section.splitlines() if x.startswith(f"| `{column}` |"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_field_tables_say_required_allowed_values_and_units() -> None:
    doc = render()
    assert _row(doc, "gpu_health", "power_w") == ["`power_w`", "Nullable(Float64)", "yes", "finite number or null",
                                                  "power draw, W"]
    assert _row(doc, "gpu_health", "gpu_util_pct")[2:4] == ["yes", "integer 0..100 or null"]
    assert _row(doc, "link_states", "kind")[2:4] == ["yes", "`ethernet`, `infiniband`"]
    assert _row(doc, "link_states", "port_rcv_data")[2] == "when `kind` = `infiniband`; else `0`"
    assert _row(doc, "flow_counters", "packets")[2] == "when `source` = `tc`; else `0`"
    assert _row(doc, "incidents", "detail")[2] == 'no, `""`'
    assert _row(doc, "control_commands", "params")[2:4] == ["no, `{}`", "map of string to (string), at most 64"]
    assert _row(doc, "flow_samples", "ts_ns")[3] == "ns since the epoch, 2000-01-01..2100-01-01"


def test_envelope_section_documents_the_record_id_header() -> None:
    doc = render().split("| topic |")[0]
    assert "`ct-rid` (optional)" in doc and "insert_deduplication_token" in doc and "docs/schemas/" in doc
