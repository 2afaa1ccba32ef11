"""JSON Schema of every event type and of the Kafka record envelope, generated from the models.

`python -m clocktower.schemas.json_schema DIR` writes `DIR/<schema>.json` per event type and
`DIR/envelope.json` (`make docs` writes docs/schemas/). A third-party producer can validate its events
against them; the models stay the one source: tests compare the committed files with a fresh run.
Rules a JSON Schema cannot hold (a record's key equals every event's node, ct-count equals the number of
events, end_ns >= start_ns) are in docs/SCHEMA.md.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from clocktower.schemas.codec import H_COUNT, H_SCHEMA, H_VERSION, MAX_BATCH_EVENTS
from clocktower.schemas.event import Event
from clocktower.schemas.topics import BY_MODEL, MAX_RECORD_BYTES, TOPICS

DIALECT = "https://json-schema.org/draft/2020-12/schema"
# The record id header: set by clocktower's spooling publisher (producers/spooling_publisher.py RID_HEADER).
H_RID = "ct-rid"


def event_schema(model: type[Event]) -> dict[str, Any]:
    """One event of `model`: its fields, which are required, and their allowed values."""
    spec = BY_MODEL[model]
    schema: dict[str, Any] = {"$schema": DIALECT, "$id": f"{model.SCHEMA}.json", **model.model_json_schema()}
    if model.REQUIRED_WHEN:   # defaults that apply only where the field does not (see Event.REQUIRED_WHEN)
        schema["allOf"] = [{"if": {"properties": {name: {"const": value}}, "required": [name]},
                            "then": {"required": list(fields)}}
                           for (name, value), fields in model.REQUIRED_WHEN.items()]
    schema["x-clocktower"] = {"schema": model.SCHEMA, "version": model.VERSION, "topic": spec.name,
                              "table": spec.table}
    return schema


def envelope_schema() -> dict[str, Any]:
    """One Kafka record: its key, headers (as UTF-8 strings) and value, a JSON array of one schema's events."""
    schemas = [t.model.SCHEMA for t in TOPICS]
    return {
        "$schema": DIALECT,
        "$id": "envelope.json",
        "title": "Record",
        "description": "One Kafka record: a batch of events of one schema from one node. `key` must equal every "
                       f"event's `node`; `{H_COUNT}` the number of events; the value is at most "
                       f"{MAX_RECORD_BYTES} bytes of JSON.",
        "type": "object",
        "properties": {
            "key": {"type": "string", "minLength": 1, "maxLength": 256, "description": "the node id"},
            "headers": {
                "type": "object",
                "properties": {
                    H_SCHEMA: {"enum": schemas, "description": "the events' schema"},
                    H_VERSION: {"type": "string", "pattern": "^[0-9]+$",
                                "description": "the schema's version (x-clocktower.version in its schema)"},
                    H_COUNT: {"type": "string", "pattern": "^[0-9]+$", "description": "the number of events"},
                    H_RID: {"type": "string", "description": "optional record id, unique per record: the spooling "
                                                             "publisher's duplicate check; ignored by decoders"},
                },
                "required": [H_SCHEMA, H_VERSION, H_COUNT],
            },
            "value": {"type": "array", "minItems": 1, "maxItems": MAX_BATCH_EVENTS},
        },
        "required": ["key", "headers", "value"],
        "allOf": [{"if": {"properties": {"headers": {"properties": {H_SCHEMA: {"const": t.model.SCHEMA}},
                                                     "required": [H_SCHEMA]}},
                          "required": ["headers"]},
                   "then": {"properties": {"value": {"items": {"$ref": f"{t.model.SCHEMA}.json"}},
                                           "headers": {"properties": {H_VERSION: {"const": str(t.model.VERSION)}}}}}}
                  for t in TOPICS],
    }


def render_all() -> dict[str, str]:
    """File name -> JSON text, for every event type and the envelope."""
    files = {f"{t.model.SCHEMA}.json": event_schema(t.model) for t in TOPICS}
    files["envelope.json"] = envelope_schema()
    return {name: json.dumps(s, indent=2, ensure_ascii=False) + "\n" for name, s in files.items()}


def write_all(directory: Path) -> list[Path]:
    """Write every schema into `directory` (made if absent); stale *.json files there are removed."""
    directory.mkdir(parents=True, exist_ok=True)
    files = render_all()
    for old in directory.glob("*.json"):
        if old.name not in files:
            old.unlink()
    out = []
    for name, text in files.items():
        path = directory / name
        path.write_text(text)
        out.append(path)
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m clocktower.schemas.json_schema DIR")
    write_all(Path(sys.argv[1]))
