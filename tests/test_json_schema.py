"""docs/schemas/ (the published JSON Schemas) are generated from the models and say what the models enforce.

The `jsonschema` package is not installed, so the schemas' required fields, bounds and allowed values are checked
against pydantic's own validation, field by field, on one complete sample per event type.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from clocktower.producers.spooling_publisher import RID_HEADER
from clocktower.schemas.json_schema import write_all
from clocktower.schemas.topics import BY_SCHEMA
from tests.event_samples import SAMPLES

COMMITTED = Path(__file__).resolve().parent.parent / "docs" / "schemas"


def _schema(name: str) -> dict[str, Any]:
    return json.loads((COMMITTED / f"{name}.json").read_text())


def _valid(name: str, event: dict[str, Any]) -> bool:
    try:
        BY_SCHEMA[name].model.model_validate_json(json.dumps(event))
    except ValidationError:
        return False
    return True


def _required(schema: dict[str, Any], event: dict[str, Any]) -> set[str]:
    """The fields `schema` requires of `event`: `required`, plus each `allOf` if/then whose `if` matches."""
    out = set(schema["required"])
    for rule in schema.get("allOf", ()):
        cond = rule["if"]
        if all(f in event for f in cond["required"]) and \
                all(event[f] == c["const"] for f, c in cond["properties"].items()):
            out |= set(rule["then"]["required"])
    return out


def _bounded(prop: dict[str, Any]) -> dict[str, Any]:
    """The non-null alternative of a nullable property (its bounds live there)."""
    return next((p for p in prop.get("anyOf", ()) if p.get("type") != "null"), prop)


def test_committed_json_schemas_are_up_to_date(tmp_path: Path) -> None:
    write_all(tmp_path)
    fresh = {p.name: p.read_text() for p in tmp_path.glob("*.json")}
    committed = {p.name: p.read_text() for p in COMMITTED.glob("*.json")}
    assert committed == fresh, "run `make docs`"
    assert set(fresh) == {f"{s}.json" for s in BY_SCHEMA} | {"envelope.json"}


def test_every_event_type_has_a_sample() -> None:
    assert {s.split("/")[0] for s in SAMPLES} == set(BY_SCHEMA)


@pytest.mark.parametrize("sample", SAMPLES)
def test_schema_requires_exactly_what_validation_requires(sample: str) -> None:
    name, event = sample.split("/")[0], SAMPLES[sample]
    schema = _schema(name)
    assert _valid(name, event)
    assert schema["additionalProperties"] is False and not _valid(name, {**event, "bogus": 1})
    required = _required(schema, event)
    for field in event:
        without = {k: v for k, v in event.items() if k != field}
        assert (field in required) == (not _valid(name, without)), field


@pytest.mark.parametrize("sample", SAMPLES)
def test_schema_bounds_and_allowed_values_are_what_validation_allows(sample: str) -> None:
    name, event = sample.split("/")[0], SAMPLES[sample]
    props = _schema(name)["properties"]
    switches = {f for f, _ in BY_SCHEMA[name].model.REQUIRED_WHEN}
    assert set(event) <= set(props)
    for field, prop in props.items():
        p = _bounded(prop)
        if "enum" in p:
            if field not in switches:   # a REQUIRED_WHEN switch needs other fields to change with it
                assert all(_valid(name, {**event, field: v}) for v in p["enum"]), field
            assert not _valid(name, {**event, field: "not-an-allowed-value"}), field
        if "maximum" in p:
            assert not _valid(name, {**event, field: p["maximum"] + 1}), field
        if "minimum" in p:
            assert not _valid(name, {**event, field: p["minimum"] - 1}), field
        if "maxLength" in p:
            assert not _valid(name, {**event, field: "x" * (p["maxLength"] + 1)}), field
        if "anyOf" in prop and field in event:
            assert _valid(name, {**event, field: None}), field   # nullable in the schema: null accepted


def test_envelope_points_every_schema_at_its_event_file() -> None:
    env = _schema("envelope")
    assert env["properties"]["headers"]["properties"]["ct-schema"]["enum"] == list(BY_SCHEMA)
    refs = {r["if"]["properties"]["headers"]["properties"]["ct-schema"]["const"]:
            r["then"]["properties"]["value"]["items"]["$ref"] for r in env["allOf"]}
    assert refs == {s: f"{s}.json" for s in BY_SCHEMA}
    assert RID_HEADER in env["properties"]["headers"]["properties"]   # the header the spooling publisher sets
    assert RID_HEADER not in env["properties"]["headers"]["required"]
