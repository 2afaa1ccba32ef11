"""The base every event model derives from."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from clocktower.schemas.column_types import Name, TimestampNs

F = TypeVar("F", bound=Callable[..., Any])


class Event(BaseModel):
    """One timestamped fact reported by (or about) one node.

    `SCHEMA` and `VERSION` travel in the Kafka headers; `ORDER_BY` is the
    ClickHouse sorting key. Events derived by at-least-once processors set
    `REPLACING = True`: `ORDER_BY` is then their natural key, the table is a
    ReplacingMergeTree, and a re-emitted duplicate collapses (read with FINAL).
    Unknown fields are rejected so that a producer bug shows up in `deadletter`
    instead of silently dropping data.

    Required fields: every measurement (a reading, counter or latency) is required, so that an event
    missing one is a dead letter instead of a stored 0 that looks like a real reading. A field keeps a
    default only where the default is a true value (an empty `detail`, no `params`), or where the field
    does not apply to that kind of record: `REQUIRED_WHEN` lists those, {(field, value): fields required
    when field == value}, enforced by `missing_when_required` in the models that have any.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    SCHEMA: ClassVar[str]
    VERSION: ClassVar[int] = 1
    ORDER_BY: ClassVar[tuple[str, ...]] = ("node", "ts_ns")
    REPLACING: ClassVar[bool] = False
    REQUIRED_WHEN: ClassVar[dict[tuple[str, Any], tuple[str, ...]]] = {}

    node: Name = Field(description="the node the event is from or about; every event's node is its record's key")
    ts_ns: TimestampNs = Field(description="when, in ns since the epoch on that node's clock")


def missing_when_required(event: Event) -> None:
    """Raise if a field that `REQUIRED_WHEN` requires for this record was not given (its default was used)."""
    given = event.model_fields_set
    for (name, value), fields in event.REQUIRED_WHEN.items():
        if getattr(event, name) == value and not given.issuperset(fields):
            missing = [f for f in fields if f not in given]
            raise ValueError(f"{', '.join(missing)} required when {name} is {value!r}")


def column_rule(*rule: str) -> Callable[[F], F]:
    """Say what a model validator checks, so that schemas/fast_columns.py can check it over whole columns.

    ("ordered", a, b): field a <= field b in every event. ("all_fields_given",): the validator passes whenever
    every field is given (REQUIRED_WHEN, defaults of old records). A validator without a rule keeps its
    model's records on pydantic's path; the rule must say what the validator does (tests/test_fast_columns.py).
    Put it under `@model_validator` (and under `@classmethod`).
    """
    def mark(func: F) -> F:
        func.column_rule = rule   # type: ignore[attr-defined]
        return func
    return mark
