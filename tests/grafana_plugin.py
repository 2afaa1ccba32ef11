"""What Grafana and grafana-clickhouse-datasource 4.20.0 do to a panel's SQL and to its result, for the tests.

Ported from their sources, so a panel is checked as Grafana would run it:
- the frontend (src/data/CHDatasource.ts): `applyConditionalAll`, then `templateSrv.replace` with the plugin's
  format (an array becomes 'a','b'; `${var:singlequote}` quotes each value and escapes its quotes);
- the backend (pkg/macros/macros.go): $__timeFilter, $__timeInterval, $__interval_s, $__fromTime, $__toTime;
- the plugin SDK (data/time_series.go, through sqlds for format 0): LongToWide, one series per distinct set of
  label values (string and bool columns) and value column; unsorted time is an error there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

ALL = "$__all"


@dataclass(frozen=True)
class QueryContext:
    start: datetime
    end: datetime
    interval_s: int
    variables: dict[str, list[str]]   # name -> picked values; [ALL] for "All"


def _macro_args(sql: str, open_at: int) -> list[str]:
    """CHDatasource.getMacroArgs: the top-level comma-separated arguments of the call opening at `open_at`."""
    args, depth, last = [], 0, open_at + 1
    for m in re.finditer(r"[(),]", sql[open_at:]):
        i = open_at + m.start()
        depth += {"(": 1, ")": -1, ",": 0}[m.group()]
        if m.group() == "," and depth == 1:
            args.append(sql[last:i])
            last = i + 1
        if depth == 0:
            args.append(sql[last:i])
            return args
    return []


def apply_conditional_all(sql: str, variables: dict[str, list[str]]) -> str:
    macro = "$__conditionalAll("
    at = sql.rfind(macro)
    while at != -1:
        params = _macro_args(sql, at + len(macro) - 1)
        if len(params) != 2:
            return sql
        name = re.search(r"(?<=\$\{)\w+(?=\})|(?<=\$)\w+", params[1].strip())
        phrase = params[0]
        if name:
            value = ",".join(variables.get(name.group(), []))
            if value in ("", ALL):
                phrase = "1=1"
        sql = sql.replace(f"{macro}{params[0]},{params[1]})", phrase)
        at = sql.rfind(macro)
    return sql


def replace_variables(sql: str, variables: dict[str, list[str]]) -> str:
    """templateSrv.replace with the plugin's format; an unknown variable is left as it is, as Grafana does."""
    def one(m: re.Match) -> str:
        name = m.group("braced") or m.group("plain")
        fmt = m.group("fmt")
        if name not in variables:
            return m.group()
        values = variables[name]
        if fmt == "singlequote":
            return ",".join("'" + v.replace("'", "\\'") + "'" for v in values)
        if fmt is not None:
            raise AssertionError(f"format {fmt!r} of ${name} is not one the tests know")
        return "'" + "','".join(values) + "'"
    return re.sub(r"\$\{(?P<braced>\w+)(?::(?P<fmt>\w+))?\}|\$(?P<plain>(?!__)\w+)", one, sql)


def expand_macros(sql: str, ctx: QueryContext) -> str:
    frm, to = int(ctx.start.timestamp()), int(ctx.end.timestamp())
    sql = re.sub(r"\$__timeFilter\(\s*([^()]+?)\s*\)",
                 lambda m: f"{m[1]} >= toDateTime({frm}) AND {m[1]} <= toDateTime({to})", sql)
    sql = re.sub(r"\$__timeInterval\(\s*([^()]+?)\s*\)",
                 lambda m: f"toStartOfInterval(toDateTime({m[1]}), INTERVAL {max(ctx.interval_s, 1)} second)", sql)
    sql = sql.replace("$__interval_s", str(max(ctx.interval_s, 1)))
    sql = sql.replace("$__fromTime", f"toDateTime({frm})").replace("$__toTime", f"toDateTime({to})")
    left = re.findall(r"\$__\w+", sql)
    assert not left, f"macros the tests do not expand: {left}"
    return sql


def interpolate(sql: str, ctx: QueryContext) -> str:
    """The SQL the engine receives for a panel: variables in the browser, then macros in the plugin's backend."""
    sql = replace_variables(apply_conditional_all(sql, ctx.variables), ctx.variables)
    leftover = re.findall(r"\$\{?\w+", sql.replace("$__", ""))
    assert not leftover, f"variables left in the SQL: {leftover}"
    return expand_macros(sql, ctx)


# ClickHouse types as the plugin converts them to data frame fields (pkg/converters): the kinds the checks need.
def field_kind(ch_type: str) -> str:
    t = re.sub(r"^(Nullable|LowCardinality)\((.*)\)$", r"\2", ch_type)
    t = re.sub(r"^(Nullable|LowCardinality)\((.*)\)$", r"\2", t)
    if t.startswith("DateTime") or t == "Date" or t == "Date32":
        return "time"
    if t in ("String", "UUID", "IPv4", "IPv6") or t.startswith(("FixedString", "Enum")):
        return "string"
    if t == "Bool":
        return "bool"
    if re.fullmatch(r"U?Int\d+|Float\d+|Decimal.*", t):
        return "number"
    return "other"


@dataclass(frozen=True)
class Series:
    name: str
    labels: tuple[tuple[str, str], ...]
    points: int


def long_to_wide(names: list[str], types: list[str], rows: list[tuple]) -> list[Series]:
    """data.LongToWide: the wide frame's value fields, each named by its column and labelled by the factors."""
    kinds = [field_kind(t) for t in types]
    time_at = kinds.index("time")
    factors = [i for i, k in enumerate(kinds) if k in ("string", "bool") and i != time_at]
    values = [i for i in range(len(names)) if i != time_at and i not in factors]
    if not factors:
        return [Series(names[i], (), len(rows)) for i in values]
    points: dict[tuple, int] = {}
    last = rows[0][time_at]
    for row in rows:
        assert row[time_at] >= last, "long series must be sorted ascending by time to be converted"
        last = row[time_at]
        key = tuple((names[i], str(row[i]).lower() if kinds[i] == "bool" else row[i]) for i in factors)
        points[key] = points.get(key, 0) + 1
    return [Series(names[i], key, n) for key, n in points.items() for i in values]
