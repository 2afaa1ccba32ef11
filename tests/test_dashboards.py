"""The dashboards as the ClickHouse plugin reads them: format, plugin version, and FINAL where rows are replaced.

The plugin (grafana-clickhouse-datasource, through grafana/sqlds) reads a target's `format` as the plugin SDK's
sqlutil.FormatQueryOption: 0 time series (a long result becomes one series per label), 1 table. A target without
`pluginVersion` is taken for an old-style query and migrated. Tables whose rows a redelivery writes again
(REPLACING models) show each row once only with FINAL: after a worker restart the incidents panel showed 11 rows
where there were 9.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from clocktower.dashboards import DASHBOARDS
from clocktower.dashboards.__main__ import main as dashboards_main
from clocktower.dashboards.layout import render
from clocktower.schemas.topics import TOPICS

ROOT = Path(__file__).resolve().parents[1]
FILES = sorted((ROOT / "grafana" / "dashboards").glob("*.json"))
FORMAT = {"timeseries": 0, "heatmap": 0, "table": 1, "stat": 1}
REPLACED = {t.table for t in TOPICS if getattr(t.model, "REPLACING", False)}


def _plugin_version() -> str:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    plugins = compose["services"]["grafana"]["environment"]["GF_INSTALL_PLUGINS"]
    name, _, version = plugins.partition(" ")
    assert name == "grafana-clickhouse-datasource" and re.fullmatch(r"\d+\.\d+\.\d+", version), plugins
    return version


def _targets(dashboard: Path) -> list[tuple[dict, dict]]:
    """Every panel's targets, and the annotations' (as a panel of their own)."""
    board = json.loads(dashboard.read_text())
    targets = [(panel, target) for panel in board["panels"] for target in panel["targets"]]
    return targets + [({"title": a["name"], "type": "table"}, a["target"])
                      for a in board["annotations"]["list"] if "target" in a]


def test_the_shipped_files_are_what_the_dashboard_models_make() -> None:
    assert dashboards_main(["--root", str(ROOT), "--check"]) == 0, "run `make dashboards`"


def test_seven_dashboards_each_with_the_variables_it_filters_by() -> None:
    boards = {d.uid: d for d in DASHBOARDS}
    assert len(boards) == 7
    for board in DASHBOARDS:
        names = [v["name"] for v in render(board)["templating"]["list"]]
        assert names[0] == "cluster"
        sql = " ".join(p.sql for p in board.panels)
        for name in names[1:]:
            if name == "prometheus":
                assert any(p.promql for p in board.panels), f"{board.uid}: a Prometheus variable and no panel"
                continue
            assert f"${name}" in sql, f"{board.uid}: ${name} is offered but no panel filters by it"
        for name in ("job", "node", "gpu"):
            assert f"${name}" not in sql or name in names, f"{board.uid}: ${name} is used but not defined"
    assert {"cluster", "job", "node", "gpu"} <= {v for d in DASHBOARDS for v in d.variables}


def test_every_target_reads_the_cluster_picked() -> None:
    for dashboard in DASHBOARDS:
        for panel in render(dashboard)["panels"]:
            if panel["datasource"]["type"] == "prometheus":
                continue
            assert panel["datasource"]["uid"] == "${cluster}"
            assert all(t["datasource"]["uid"] == "${cluster}" for t in panel["targets"])


@pytest.mark.parametrize("dashboard", FILES, ids=lambda p: p.name)
def test_every_target_asks_the_format_its_panel_draws_and_names_the_pinned_plugin(dashboard: Path) -> None:
    version = _plugin_version()
    for panel, target in _targets(dashboard):
        if "expr" in target:   # a Prometheus target (the pipeline's own metrics)
            assert target["datasource"] == {"type": "prometheus", "uid": "${prometheus}"}, panel["title"]
            continue
        assert target["format"] == FORMAT[panel["type"]], panel["title"]
        assert target["queryType"] == ("timeseries" if target["format"] == 0 else "table"), panel["title"]
        assert (target["pluginVersion"], target["editorType"]) == (version, "sql"), panel["title"]


@pytest.mark.parametrize("dashboard", FILES, ids=lambda p: p.name)
def test_every_table_whose_rows_are_replaced_is_read_with_final(dashboard: Path) -> None:
    assert {"incidents", "control_commands", "flow_latency", "iteration_breakdown"} <= REPLACED
    read = []
    for panel, target in _targets(dashboard):
        for table, final in re.findall(r"\bFROM\s+(\w+)(\s+FINAL\b)?", target.get("rawSql", "")):
            read.append(table)
            assert table not in REPLACED or final, f"{panel['title']}: {table} without FINAL"
    assert REPLACED & set(read)
