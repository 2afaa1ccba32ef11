"""`clocktower report`: one self-contained HTML file with charts, for people who would rather look than read.

Four Plotly charts (the library's JavaScript is inlined once: the file opens offline, from a mail or a ticket):
the iteration timeline with stragglers marked, one-way delay per link over time, GPU temperature with throttling
marked, and incidents with the actions taken; then `clocktower explain`'s narrative of the worst iterations and
the incidents and commands as tables. Pure: it draws what report_query.py read.

The page records its own failures: a script that runs first collects uncaught errors and console.error calls, and
one that runs last writes how many charts drew and those errors into `#report-status` (data-charts,
data-errors), so a headless browser, or a person, sees at once whether the report rendered.
"""

from __future__ import annotations

import html
from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from clocktower.report_query import STRAGGLER, ReportData

CHARTS = 4
SEVERITY_COLOR = {"critical": "#d62728", "warning": "#ff7f0e", "info": "#1f77b4"}
STATUS_COLOR = {"applied": "#2ca02c", "refused": "#d62728", "failed": "#d62728"}

ERROR_HOOK = """<script>
window.__reportErrors = [];
window.addEventListener("error", function (e) { window.__reportErrors.push(String(e.message || e)); });
(function () { var original = console.error; console.error = function () {
  window.__reportErrors.push(Array.prototype.join.call(arguments, " ")); original.apply(console, arguments); }; })();
</script>"""

STATUS_SCRIPT = """<script>
window.addEventListener("load", function () {
  var plots = Array.prototype.slice.call(document.querySelectorAll(".js-plotly-plot"));
  var traces = plots.map(function (p) { return p.querySelectorAll(".main-svg .trace").length; });
  var drawn = traces.filter(function (n) { return n > 0; }).length;
  var status = document.getElementById("report-status");
  status.dataset.charts = String(drawn);
  status.dataset.traces = traces.join(",");
  status.dataset.errors = String(window.__reportErrors.length);
  status.textContent = drawn + " of CHARTS charts drawn" +
    (window.__reportErrors.length ? "; errors: " + window.__reportErrors.join(" | ") : "; no errors");
});
</script>""".replace("CHARTS", str(CHARTS))

STYLE = """<style>
body { font-family: system-ui, sans-serif; margin: 24px; color: #222; max-width: 1400px; }
h1 { margin-bottom: 4px; } .meta { color: #666; margin-top: 0; } #report-status { color: #666; font-size: 12px; }
table { border-collapse: collapse; font-size: 13px; margin: 8px 0 24px; }
td, th { border-bottom: 1px solid #ddd; padding: 4px 8px; text-align: left; vertical-align: top; }
.narrative li { margin: 2px 0; } .chart { margin-bottom: 16px; }
</style>"""


def _ts(ns_or_dt: object) -> str:
    if isinstance(ns_or_dt, datetime):
        return ns_or_dt.strftime("%Y-%m-%d %H:%M:%S")
    return datetime.fromtimestamp(int(ns_or_dt) / 1e9, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _layout(fig: go.Figure, title: str, ytitle: str) -> go.Figure:
    fig.update_layout(title=title, yaxis_title=ytitle, height=380, margin={"l": 60, "r": 20, "t": 50, "b": 40},
                      legend={"orientation": "h", "y": -0.15}, template="plotly_white")
    return fig


def iteration_chart(data: ReportData) -> go.Figure:
    t = [r[0] for r in data.iterations]
    fig = go.Figure()
    fig.add_scatter(x=t, y=[r[2] for r in data.iterations], mode="lines", name="iteration time",
                    line={"color": "#1f77b4", "width": 1})
    fig.add_scatter(x=t, y=[r[3] for r in data.iterations], mode="lines", name="baseline",
                    line={"color": "#999", "dash": "dot"})
    slow = [r for r in data.iterations if r[4] >= STRAGGLER]
    fig.add_scatter(x=[r[0] for r in slow], y=[r[2] for r in slow], mode="markers", name=f"≥ {STRAGGLER}× baseline",
                    marker={"color": "#d62728", "size": 9, "symbol": "x"},
                    text=[f"iteration {r[1]}: {r[4]:.2f}×, rank {r[5]}, blame {r[6]}" for r in slow],
                    hoverinfo="text+x")
    return _layout(fig, f"Iterations of {data.job}: stragglers marked", "ms")


def _series(rows: Sequence[tuple], value: int = 2) -> dict[str, tuple[list, list]]:
    out: dict[str, tuple[list, list]] = defaultdict(lambda: ([], []))
    for r in rows:
        out[r[1]][0].append(r[0])
        out[r[1]][1].append(r[value])
    return out


def latency_chart(data: ReportData) -> go.Figure:
    fig = go.Figure()
    for link, (x, y) in sorted(_series(data.latency).items()):
        fig.add_scatter(x=x, y=y, mode="lines", name=link)
    return _layout(fig, "One-way delay p99 per link (clock-corrected)", "µs")


def temperature_chart(data: ReportData) -> go.Figure:
    fig = go.Figure()
    for node, (x, y) in sorted(_series(data.temperature).items()):
        fig.add_scatter(x=x, y=y, mode="lines", name=node)
    hot = [r for r in data.temperature if r[3] > 0]
    fig.add_scatter(x=[r[0] for r in hot], y=[r[2] for r in hot], mode="markers", name="throttled",
                    marker={"color": "#d62728", "size": 7, "symbol": "triangle-up"},
                    text=[f"{r[1]}: {r[3]} throttled samples" for r in hot], hoverinfo="text+x")
    return _layout(fig, "GPU temperature (hottest GPU per node); throttling marked", "°C")


def incident_chart(data: ReportData) -> go.Figure:
    fig = go.Figure()
    end = datetime.fromtimestamp(data.end_ns / 1e9, UTC).replace(tzinfo=None)
    for opened, resolved, kind, severity, target, detail in data.incidents:
        label = f"{kind} {target}"
        fig.add_scatter(x=[opened, resolved or end], y=[label, label], mode="lines+markers", showlegend=False,
                        line={"color": SEVERITY_COLOR.get(severity, "#555"), "width": 8},
                        text=[detail, detail], hoverinfo="text+x")
    for at, node, action, target, status, detail in data.commands:
        fig.add_scatter(x=[at], y=[f"{action} on {node}"], mode="markers", showlegend=False,
                        marker={"color": STATUS_COLOR.get(status, "#999"), "size": 11, "symbol": "diamond"},
                        text=[f"{action} {target}: {status or 'no ack'} {detail or ''}"], hoverinfo="text+x")
    fig.update_layout(height=max(300, 40 + 28 * (len(data.incidents) + len(data.commands))))
    return _layout(fig, "Incidents (open to resolved; red critical, orange warning) and actions (green: applied)",
                   "")


def _table(head: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = "".join("<tr>" + "".join(f"<td>{html.escape(str(v if v is not None else ''))}</td>" for v in r)
                    + "</tr>" for r in rows)
    return "<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + f"</tr>{cells}</table>"


def render_report(data: ReportData, narratives: Sequence[Sequence[str]], generated: datetime) -> str:
    charts = [iteration_chart(data), latency_chart(data), temperature_chart(data), incident_chart(data)]
    assert len(charts) == CHARTS
    config = {"displaylogo": False, "responsive": True}
    divs = "".join(f'<div class="chart">{c.to_html(full_html=False, include_plotlyjs=False, config=config)}</div>'
                   for c in charts)
    stories = "".join("<ul class='narrative'>" + "".join(f"<li>{html.escape(line)}</li>" for line in lines)
                      + "</ul>" for lines in narratives)
    slow = sum(1 for r in data.iterations if r[4] >= STRAGGLER)
    title = f"clocktower report: {data.job}"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
{ERROR_HOOK}
<script>{get_plotlyjs()}</script>
{STYLE}</head>
<body>
<h1>{html.escape(title)}</h1>
<p class="meta">{_ts(data.start_ns)} to {_ts(data.end_ns)} UTC · {len(data.iterations)} iterations, {slow} at
{STRAGGLER}× the baseline or more · {len(data.incidents)} incidents · {len(data.commands)} commands ·
generated {_ts(generated)} UTC</p>
<p id="report-status" data-charts="" data-errors="">charts not drawn yet</p>
{divs}
<h2>The worst iterations, explained</h2>
{stories or "<p>No iteration was judged slow.</p>"}
<h2>Incidents</h2>
{_table(["opened", "resolved", "kind", "severity", "target", "detail"], data.incidents)}
<h2>Commands and acks</h2>
{_table(["time", "node", "action", "target", "status", "detail"], data.commands)}
{STATUS_SCRIPT}
</body></html>
"""
