"""Clock sync: how far each node's clock is from the reference, and how sure the estimate is."""

from __future__ import annotations

from clocktower.dashboards.layout import Dashboard, Panel
from clocktower.dashboards.variables import NODE_IS


def _per_node(title: str, value: str, unit: str, description: str = "") -> Panel:
    return Panel(title, f"""SELECT $__timeInterval(time) AS t, node, {value}
FROM clock_estimates
WHERE $__timeFilter(time) AND {NODE_IS}
GROUP BY t, node ORDER BY t""", unit=unit, description=description)


DASHBOARD = Dashboard(
    uid="clocktower-clock", title="clocktower: clock sync",
    question="How far is each node's clock from the reference, how fast does it drift, and how sure are we?",
    panels=(
        _per_node("Offset vs reference per node (µs)", "avg(offset_ns) / 1000 AS offset_us", "µs"),
        _per_node("Error bound per node (ns)", "max(error_bound_ns) AS error_bound", "ns",
                  "The bound the one-way delays corrected with this estimate carry."),
        _per_node("Drift per node (ppb)", "avg(drift_ppb) AS drift", "none"),
        Panel("Share of one-way delays clock-corrected", f"""SELECT $__timeInterval(time) AS t, avg(clock_corrected) AS corrected
FROM flow_latency FINAL
WHERE $__timeFilter(time) AND {NODE_IS}
GROUP BY t ORDER BY t""", unit="percentunit",
              description="Below 100%: a receiver or sender had no clock estimate yet (start, or a silent node)."),
        Panel("Per-pair fit residual (ns)", f"""SELECT $__timeInterval(time) AS t, concat(node, ' ↔ ', hi) AS pair, max(sigma_ns) AS sigma
FROM clock_edges
WHERE $__timeFilter(time) AND valid AND {NODE_IS}
GROUP BY t, pair ORDER BY t""", unit="ns", width=24,
              description="The noise of each probed pair's offset fit: a pair that jumps has a noisy path."),
    ),
)
