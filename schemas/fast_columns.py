"""A fast batch decoder generated from the pydantic models: orjson, then whole-column checks.

`decoder(model)` reads each field's annotation and constraints (the `Annotated` aliases of
schemas/column_types.py: bounds, lengths, literals, nullability, lists) and builds one check per column.
`FastDecoder.columns(value)` parses a batch with orjson, transposes it into one tuple per field and checks
each column with a few C-level passes (`set(map(type, ...))`, `min`, `max`), with no Python object per
event beyond orjson's dicts.

It only ever says yes when pydantic would: every field must be given with exactly the JSON type pydantic
stores (no lax coercions: an int for a float, a string for an int, 0/1 for a bool), so anything it is
unsure of (None) goes to pydantic, which gives the verdict and the dead-letter reason. Model validators
are honoured only where the model says what they check (`column_rule` in schemas/event.py); a model with
any constraint, validator or hook this module does not know is never fast (`decoder` returns None).
tests/test_fast_columns.py checks with hypothesis that the two agree on every generated record.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from itertools import chain
from operator import itemgetter, le
from typing import Any, Literal

import annotated_types as at
import orjson
from pydantic.fields import FieldInfo
from pydantic.types import AllowInfNan

from clocktower.schemas.column_types import CH, Codec
from clocktower.schemas.event import Event

ColumnCheck = Callable[[Sequence[Any]], bool]
_NONE = type(None)
_CONSTRAINT_ATTRIBUTES = {"annotation", "ge", "le", "min_length", "max_length", "allow_inf_nan", "description", "title"}


class Unsupported(TypeError):
    """A field or model the fast path cannot decide: its records always go to pydantic."""


@dataclass(frozen=True)
class _Constraints:
    ge: int | None = None
    le: int | None = None
    min_len: int | None = None
    max_len: int | None = None


def _constraints(metadata: Sequence[Any]) -> _Constraints:
    out: dict[str, int] = {}
    for m in metadata:
        if isinstance(m, at.Ge):
            out["ge"] = m.ge   # type: ignore[assignment]
        elif isinstance(m, at.Le):
            out["le"] = m.le   # type: ignore[assignment]
        elif isinstance(m, at.MinLen):
            out["min_len"] = m.min_length
        elif isinstance(m, at.MaxLen):
            out["max_len"] = m.max_length
        elif isinstance(m, AllowInfNan | CH | Codec):
            pass   # orjson refuses NaN and infinities; CH and Codec say how it is stored only
        elif isinstance(m, FieldInfo):   # an Annotated alias's own Field(...): its constraints count too
            if set(m._attributes_set) - _CONSTRAINT_ATTRIBUTES:   # a default, alias, ... inside an alias
                raise Unsupported(f"Field attributes {sorted(m._attributes_set)} in an annotation")
            out.update({k: v for k, v in vars(_constraints(m.metadata)).items() if v is not None})
        else:
            raise Unsupported(f"constraint {m!r}")
    return _Constraints(**out)


def _check(annotation: Any, metadata: Sequence[Any]) -> ColumnCheck:
    """The check of one column of values of `annotation` under `metadata`."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _check(args[0], [*args[1:], *metadata])
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not _NONE]
        if len(inner) != 1 or len(args) != 2:
            raise Unsupported(f"union {annotation}")
        present = _check(inner[0], metadata)
        return lambda col: present([v for v in col if v is not None] if None in col else col)
    c = _constraints(metadata)
    if origin is Literal:
        allowed = frozenset(args)
        kinds = {type(a) for a in args}
        if not kinds <= {str, int} or c != _Constraints():
            raise Unsupported(f"literal {annotation}")
        return lambda col: set(map(type, col)) <= kinds and set(col) <= allowed
    if origin is list:
        (item,) = args
        items = _check(item, [])
        if c.ge is not None or c.le is not None:
            raise Unsupported(f"bounds on a list {annotation}")
        return _sized(list, c, lambda col: items(list(chain.from_iterable(col))))
    if annotation is int:
        if c.min_len is not None or c.max_len is not None:
            raise Unsupported("lengths on an int")
        return _bounded(c.ge, c.le)
    if annotation is float:
        if c != _Constraints():
            raise Unsupported("bounds on a float")
        return lambda col: set(map(type, col)) <= {float}
    if annotation is bool:
        if c != _Constraints():
            raise Unsupported("constraints on a bool")
        return lambda col: set(map(type, col)) <= {bool}
    if annotation is str:
        if c.ge is not None or c.le is not None:
            raise Unsupported("bounds on a str")
        return _sized(str, c, lambda col: True)
    raise Unsupported(f"type {annotation!r}")


def _bounded(lo: int | None, hi: int | None) -> ColumnCheck:
    def check(col: Sequence[Any]) -> bool:
        if not set(map(type, col)) <= {int}:   # type(True) is bool: no bool passes for an int
            return False
        return not col or ((lo is None or min(col) >= lo) and (hi is None or max(col) <= hi))
    return check


def _sized(kind: type, c: _Constraints, items: ColumnCheck) -> ColumnCheck:
    lo, hi = c.min_len, c.max_len

    def check(col: Sequence[Any]) -> bool:
        if not set(map(type, col)) <= {kind}:
            return False
        if col and (lo is not None or hi is not None):
            lengths = list(map(len, col))
            if (lo is not None and min(lengths) < lo) or (hi is not None and max(lengths) > hi):
                return False
        return items(col)
    return check


# Model settings that change no value and accept nothing more (anything else, e.g. str_strip_whitespace: pydantic).
_NEUTRAL_CONFIG = {"extra", "frozen", "title", "json_schema_extra"}


def _model_rules(model: type[Event], names: tuple[str, ...]) -> list[Callable[[dict[str, Sequence[Any]]], bool]]:
    """What each model validator checks, as a check over whole columns (every field is given on this path)."""
    if set(model.model_config) - _NEUTRAL_CONFIG or model.model_config.get("extra") != "forbid":
        raise Unsupported(f"model settings {sorted(model.model_config)}")
    if model.__pydantic_post_init__ is not None:
        raise Unsupported("model_post_init")
    decorators = model.__pydantic_decorators__
    if decorators.field_validators or decorators.validators or decorators.root_validators:
        raise Unsupported("field validators")
    rules = []
    for name, dec in decorators.model_validators.items():
        rule = getattr(dec.func, "column_rule", None)
        if rule is None:
            raise Unsupported(f"model validator {name} says nothing of what it checks (column_rule)")
        if rule[0] == "all_fields_given":
            continue   # REQUIRED_WHEN and defaults for old records: met when every field is given
        if rule[0] == "ordered" and len(rule) == 3 and all(
                f in names and _int_of(model.model_fields[f].annotation) for f in rule[1:]):
            first, then = rule[1], rule[2]
            rules.append(lambda cols, a=first, b=then: all(map(le, cols[a], cols[b])))
            continue
        raise Unsupported(f"model validator {name}: unknown rule {rule!r}")
    return rules


def _int_of(annotation: Any) -> bool:
    """An int, however annotated, and never null: `ordered` compares such columns."""
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation is int


@dataclass(frozen=True)
class FastDecoder:
    """Decodes a batch (a JSON array of events) of one model into columns, or says None to mean: ask pydantic."""

    model: type[Event]
    names: tuple[str, ...]
    checks: tuple[ColumnCheck, ...]
    rules: tuple[Callable[[dict[str, Sequence[Any]]], bool], ...]

    def columns(self, value: bytes) -> list[tuple[Any, ...]] | None:
        """One tuple per field (in field order), each as long as the batch; None where pydantic must decide."""
        try:
            rows = orjson.loads(value)
        except orjson.JSONDecodeError:
            return None
        if type(rows) is not list or not rows or set(map(type, rows)) != {dict}:
            return None
        if set(map(len, rows)) != {len(self.names)}:
            return None
        try:
            cols = list(zip(*map(itemgetter(*self.names), rows), strict=True))
        except KeyError:
            return None
        for check, col in zip(self.checks, cols, strict=True):
            if not check(col):
                return None
        if self.rules:
            by_name = dict(zip(self.names, cols, strict=True))
            if not all(rule(by_name) for rule in self.rules):
                return None
        return cols


@cache
def decoder(model: type[Event]) -> FastDecoder | None:
    """The fast decoder of `model`, or None where some constraint of it is one this module cannot check."""
    try:
        names, checks = [], []
        for name, field in model.model_fields.items():
            if field.alias not in (None, name) or field.validation_alias not in (None, name):
                raise Unsupported(f"{name}: an alias")
            names.append(name)
            checks.append(_check(field.annotation, list(field.metadata)))
        if len(names) < 2:
            raise Unsupported("one field: itemgetter of one name gives the value, not a 1-tuple")
        rules = _model_rules(model, tuple(names))
    except Unsupported:
        return None
    return FastDecoder(model, tuple(names), tuple(checks), tuple(rules))
