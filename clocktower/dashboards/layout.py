"""A dashboard as data: panels with their SQL, laid out and rendered as the Grafana JSON the provisioning loads.

The JSON under grafana/dashboards/ is generated from these (`make dashboards`; tests/test_dashboards.py checks it
is current), so the panel SQL, the format each panel asks the plugin for and the variables live in one place.
The ClickHouse plugin reads a target's `format` as the plugin SDK's sqlutil.FormatQueryOption: 0 time series (a
long result becomes one series per label), 1 table. Every panel's datasource is `${cluster}`: one ClickHouse per
cluster, picked with the dashboard's datasource variable.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from clocktower.dashboards.variables import DATASOURCE, PLUGIN_VERSION, PROMETHEUS, annotations, template_variables

PanelKind = Literal["timeseries", "table", "stat", "heatmap"]
FORMAT: dict[str, int] = {"timeseries": 0, "heatmap": 0, "table": 1, "stat": 1}
GRID_WIDTH = 24


@dataclass(frozen=True)
class Panel:
    """One panel and the question it answers (`description`, shown as the panel's tooltip)."""

    title: str
    sql: str
    kind: PanelKind = "timeseries"
    unit: str = "short"
    description: str = ""
    width: int = 12
    height: int = 8
    may_be_empty: str = ""   # why a simulated run may leave it empty (tests/test_dashboard_queries.py)
    promql: tuple[tuple[str, str], ...] = ()   # (expr, legend) per target: a Prometheus panel, `sql` unused

    def __post_init__(self) -> None:
        if not 1 <= self.width <= GRID_WIDTH:
            raise ValueError(f"{self.title}: width {self.width} is not 1..{GRID_WIDTH}")

    @property
    def format(self) -> int:
        return FORMAT[self.kind]


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    question: str                      # what the dashboard is for: its description
    panels: tuple[Panel, ...]
    variables: tuple[str, ...] = ("cluster", "node")
    tags: tuple[str, ...] = field(default=("clocktower",))

    @property
    def file_name(self) -> str:
        return f"{self.uid}.json"


def render(board: Dashboard) -> dict:
    """The dashboard's Grafana JSON (schemaVersion 39, what Grafana 11 writes)."""
    return {
        "uid": board.uid, "title": board.title, "description": board.question, "tags": list(board.tags),
        "schemaVersion": 39, "version": 1, "editable": True, "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": template_variables(board.variables)},
        "annotations": {"list": annotations(board.variables)},
        "panels": [_panel(i, p, pos) for i, (p, pos) in enumerate(zip(board.panels, _grid(board.panels),
                                                                       strict=True), start=1)],
    }


def _grid(panels: tuple[Panel, ...]) -> list[dict[str, int]]:
    """Left to right, then down: a panel that does not fit the row's remaining width starts the next row."""
    out, x, y, row_h = [], 0, 0, 0
    for p in panels:
        if x + p.width > GRID_WIDTH:
            x, y, row_h = 0, y + row_h, 0
        out.append({"x": x, "y": y, "w": p.width, "h": p.height})
        x, row_h = x + p.width, max(row_h, p.height)
    return out


def _panel(pid: int, p: Panel, pos: dict[str, int]) -> dict:
    if p.promql:
        source = PROMETHEUS
        targets = [{"refId": chr(ord("A") + i), "datasource": PROMETHEUS, "editorMode": "code", "expr": expr,
                    "legendFormat": legend, "range": True} for i, (expr, legend) in enumerate(p.promql)]
    else:
        source = DATASOURCE
        targets = [{"refId": "A", "datasource": DATASOURCE, "editorType": "sql", "format": p.format, "rawSql": p.sql,
                    "queryType": "timeseries" if p.format == 0 else "table", "pluginVersion": PLUGIN_VERSION}]
    panel = {"id": pid, "type": p.kind, "title": p.title, "description": p.description, "datasource": source,
             "gridPos": pos, "fieldConfig": {"defaults": {"unit": p.unit}, "overrides": []}, "targets": targets}
    if p.kind == "heatmap":
        # rows pre-aggregated by the query: one bucket per series (label), coloured by its value
        panel["options"] = {"calculate": False, "rowsFrame": {"layout": "auto"}, "yAxis": {"axisPlacement": "left"},
                            "cellValues": {"unit": p.unit}, "color": {"mode": "scheme", "scheme": "Oranges",
                                                                      "steps": 64},
                            "tooltip": {"mode": "single"}, "legend": {"show": True}}
    if p.kind == "stat":
        panel["options"] = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                            "colorMode": "value", "graphMode": "none"}
    if p.kind == "timeseries":
        panel["options"] = {"legend": {"displayMode": "table", "placement": "right", "calcs": ["max", "mean"]},
                            "tooltip": {"mode": "multi", "sort": "desc"}}
    return panel
