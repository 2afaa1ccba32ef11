"""Every dashboard panel, annotation, variable and alert rule, run as Grafana would run it, on simulated data.

The data: a simulated fleet run (every kind of fault, tests/simulated_fleet.py) in the real engine behind the
embedded endpoint. Each query is expanded the way the plugin does (tests/grafana_plugin.py), for "All" and for
one picked value of each variable, and sent as the read-only `dashboards` user Grafana logs in as. Its result
must suit its panel: a time series gets a time column, label columns and number columns, sorted by time, each
(time, labels) once, and comes back from LongToWide as one series per label; a stat gets numbers; a table rows.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from clocktower.dashboards import DASHBOARDS
from clocktower.dashboards.alert_rules import RULES
from clocktower.dashboards.layout import Dashboard, Panel, render
from clocktower.dashboards.variables import VARIABLE_SQL
from tests.grafana_plugin import ALL, QueryContext, field_kind, interpolate, long_to_wide

INTERVAL_S = 2
PANELS = [(b, p) for b in DASHBOARDS for p in b.panels if not p.promql]   # PromQL: tests/test_self_metrics.py


@pytest.fixture(scope="module")
def engine(simulated_fleet):
    """(the dashboards user's client, the time range of the data)."""
    return simulated_fleet.reader, (simulated_fleet.start, simulated_fleet.end)


def _contexts(engine, board_vars: tuple[str, ...]) -> list[QueryContext]:
    """"All" for every variable, then each variable's first value (the others "All")."""
    client, (start, end) = engine
    names = [v for v in board_vars if v in VARIABLE_SQL]
    everything = {n: [ALL] for n in names}
    out = [QueryContext(start, end, INTERVAL_S, everything)]
    for n in names:
        ctx = QueryContext(start, end, INTERVAL_S, everything)
        first = client.query(interpolate(VARIABLE_SQL[n], ctx)).result_rows[0][0]
        out.append(QueryContext(start, end, INTERVAL_S, {**everything, n: [str(first)]}))
    return out


def _check_result(panel: Panel, names: list[str], types: list[str], rows: list[tuple]) -> None:
    """The columns' types always (an empty result has them too); what the rows make, when there are any."""
    kinds = [field_kind(t) for t in types]
    if panel.kind in ("timeseries", "heatmap"):
        assert kinds[0] == "time" and kinds.count("time") == 1, f"{panel.title}: time first, once: {types}"
        assert set(kinds[1:]) <= {"string", "bool", "number"} and "number" in kinds, f"{panel.title}: {types}"
        if not rows:
            return
        keys = [(r[0], *(r[i] for i, k in enumerate(kinds) if k in ("string", "bool"))) for r in rows]
        assert len(keys) == len(set(keys)), f"{panel.title}: a (time, labels) twice: LongToWide keeps one"
        series = long_to_wide(names, types, rows)
        labelled = {s.labels for s in series}
        values = sum(k == "number" for k in kinds)
        assert len(series) == len(labelled) * values, panel.title
        if any(k in ("string", "bool") for k in kinds):
            assert all(s.labels for s in series), panel.title
    elif panel.kind == "stat":
        assert len(rows) == 1 and all(k == "number" for k in kinds), f"{panel.title}: {types} {rows}"
    else:
        assert panel.kind == "table" and names, panel.title


@pytest.mark.parametrize(("board", "panel"), PANELS, ids=[f"{b.uid}:{p.title}" for b, p in PANELS])
def test_every_panel_runs_as_grafana_runs_it_and_fits_its_panel(engine, board: Dashboard, panel: Panel) -> None:
    client, _ = engine
    for ctx in _contexts(engine, board.variables):
        result = client.query(interpolate(panel.sql, ctx))
        rows = result.result_rows
        picked = {n: v for n, v in ctx.variables.items() if v != [ALL]}
        if not picked and not panel.may_be_empty:
            assert rows, f"{panel.title}: no rows over the simulated run"
        _check_result(panel, list(result.column_names), [t.name for t in result.column_types], rows)


def test_a_long_result_becomes_one_series_per_label(engine) -> None:
    """GPU temperature per GPU: 4 nodes x 8 GPUs, one series each, as Grafana draws them (format 0)."""
    board = next(b for b in DASHBOARDS if b.uid == "clocktower-gpu")
    panel = next(p for p in board.panels if p.title.startswith("Temperature"))
    assert panel.format == 0
    ctx = _contexts(engine, board.variables)[0]
    result = engine[0].query(interpolate(panel.sql, ctx))
    series = long_to_wide(list(result.column_names), [t.name for t in result.column_types], result.result_rows)
    assert len(series) == 32 and len({s.labels for s in series}) == 32
    assert {dict(s.labels)["gpu_id"] for s in series} >= {"node-0.demo/gpu0", "node-3.demo/gpu7"}


@pytest.mark.parametrize("variable", sorted(VARIABLE_SQL))
def test_every_variable_lists_values_and_a_picked_one_narrows_the_panels(engine, variable: str) -> None:
    client, (start, end) = engine
    ctx = QueryContext(start, end, INTERVAL_S, {n: [ALL] for n in VARIABLE_SQL})
    result = client.query(interpolate(VARIABLE_SQL[variable], ctx))
    values = [r[0] for r in result.result_rows]
    assert len(result.column_names) == 1 and len(values) == len(set(values)) >= 1, values
    if variable == "node":
        picked = QueryContext(start, end, INTERVAL_S, {"node": [values[0]], "gpu": [ALL]})
        gpus = client.query(interpolate(VARIABLE_SQL["gpu"], picked)).result_rows
        assert len(gpus) == 8
        everywhere = client.query(interpolate(
            "SELECT count() FROM gpu_health WHERE $__timeFilter(time) AND "
            "$__conditionalAll(node IN (${node:singlequote}), $node)", ctx)).result_rows[0][0]
        one = client.query(interpolate(
            "SELECT count() FROM gpu_health WHERE $__timeFilter(time) AND "
            "$__conditionalAll(node IN (${node:singlequote}), $node)", picked)).result_rows[0][0]
        assert 0 < one < everywhere


def test_a_quote_in_a_picked_value_stays_inside_its_literal(engine) -> None:
    client, (start, end) = engine
    ctx = QueryContext(start, end, INTERVAL_S, {"node": ["x') OR ('1'='1"]})
    sql = interpolate("SELECT count() FROM heartbeats WHERE $__conditionalAll(node IN (${node:singlequote}), $node)",
                      ctx)
    assert client.query(sql).result_rows[0][0] == 0


ANNOTATED = [(b, a) for b in DASHBOARDS for a in render(b)["annotations"]["list"] if "target" in a]


@pytest.mark.parametrize(("board", "annotation"), ANNOTATED, ids=[f"{b.uid}:{a['name']}" for b, a in ANNOTATED])
def test_annotations_return_the_columns_grafana_reads(engine, board: Dashboard, annotation: dict) -> None:
    client, _ = engine
    for ctx in _contexts(engine, board.variables):   # with this dashboard's own variables, "All" and one picked
        result = client.query(interpolate(annotation["target"]["rawSql"], ctx))
        names = list(result.column_names)
        assert names[0] == "time" and "text" in names and "tags" in names, names
        assert field_kind(result.column_types[0].name) == "time"
        everything = all(v == [ALL] for v in ctx.variables.values())
        assert (result.result_rows or not everything) and all(r[names.index("text")] for r in result.result_rows)
        if "timeEnd" in names:
            assert all(r[names.index("timeEnd")] >= r[0] for r in result.result_rows)


def test_the_variables_offer_no_name_that_could_end_its_literal(simulated_fleet) -> None:
    """singlequote escapes a quote but not a backslash: such names are never offered to be picked."""
    admin, client, start, end = (simulated_fleet.admin, simulated_fleet.reader, simulated_fleet.start,
                                 simulated_fleet.end)
    evil = ["evil" + chr(92), "o'brien"]   # a trailing backslash; a quote
    ts = int((end.timestamp() - 30) * 1e9)
    admin.insert("heartbeats", [[name, ts, 1, 200] for name in evil],
                 column_names=["node", "ts_ns", "seq", "interval_ms"])
    try:
        ctx = QueryContext(start, end, INTERVAL_S, {"node": [ALL]})
        offered = [r[0] for r in client.query(interpolate(VARIABLE_SQL["node"], ctx)).result_rows]
        assert len(offered) == 4 and all(v.startswith("node-") for v in offered), offered
    finally:
        for table in ("heartbeats", "node_last_seen"):   # and what the rollup's view took of them
            admin.command(f"ALTER TABLE {table} DELETE WHERE NOT startsWith(node, 'node-') SETTINGS mutations_sync = 2")
    assert admin.query("SELECT count() FROM heartbeats WHERE NOT startsWith(node, 'node-')").result_rows == [(0,)]
    assert admin.query("SELECT count() FROM node_last_seen WHERE NOT startsWith(node, 'node-')").result_rows == [(0,)]


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.uid)
def test_alert_rules_run_and_give_one_number_per_instance(engine, rule) -> None:
    client, _ = engine
    end = datetime.now(UTC)
    ctx = QueryContext(end - timedelta(seconds=rule.window_s), end, 60, {})
    result = client.query(interpolate(rule.sql, ctx))
    kinds = [field_kind(t.name) for t in result.column_types]
    assert kinds.count("number") == 1 and set(kinds) <= {"number", "string"}, kinds
    labels = [tuple(v for v, k in zip(r, kinds, strict=True) if k == "string") for r in result.result_rows]
    assert len(labels) == len(set(labels)), "two alert instances with the same labels"
    if rule.uid == "clocktower-critical-incident":   # the run ends with the lost GPU's incident open
        assert ("gpu_xid", "node-3.demo/gpu5") in {row[:2] for row in result.result_rows}, result.result_rows


# The port of the plugin itself, against what its sources produce (pkg/macros/macros_test.go, CHDatasource.ts).

def test_the_port_expands_as_the_plugin_does() -> None:
    start, end = datetime.fromtimestamp(1_700_000_000, UTC), datetime.fromtimestamp(1_700_003_600, UTC)
    picked = QueryContext(start, end, 30, {"node": ["a", "b'c"]})
    sql = "SELECT $__timeInterval(time) AS t FROM x WHERE $__timeFilter(time) AND " \
          "$__conditionalAll(node IN (${node:singlequote}), $node) AND v = $__interval_s"
    assert interpolate(sql, picked) == (
        "SELECT toStartOfInterval(toDateTime(time), INTERVAL 30 second) AS t FROM x "
        "WHERE time >= toDateTime(1700000000) AND time <= toDateTime(1700003600) AND "
        "node IN ('a','b\\'c') AND v = 30")
    everything = QueryContext(start, end, 30, {"node": [ALL]})
    assert interpolate("SELECT 1 WHERE $__conditionalAll(node IN (${node:singlequote}), $node)", everything) == \
        "SELECT 1 WHERE 1=1"
    with pytest.raises(AssertionError, match="variables left"):
        interpolate("SELECT $job", everything)
    with pytest.raises(AssertionError, match="macros the tests do not expand"):
        interpolate("SELECT $__timeGroup(time, 5m)", everything)


def test_the_port_of_long_to_wide_splits_by_label_and_refuses_unsorted_time() -> None:
    t0, t1 = datetime(2026, 1, 1), datetime(2026, 1, 1, 0, 0, 1)
    types = ["DateTime", "LowCardinality(String)", "Float64", "UInt64"]
    series = long_to_wide(["t", "node", "a", "b"], types, [(t0, "x", 1.0, 1), (t0, "y", 2.0, 2), (t1, "x", 3.0, 3)])
    assert [(s.name, s.labels, s.points) for s in series] == [
        ("a", (("node", "x"),), 2), ("b", (("node", "x"),), 2), ("a", (("node", "y"),), 1), ("b", (("node", "y"),), 1)]
    with pytest.raises(AssertionError, match="sorted ascending"):
        long_to_wide(["t", "node", "a"], types[:3], [(t1, "x", 1.0), (t0, "x", 2.0)])
