"""Fleet overview: is anything wrong right now, how much training time it costs, and who stopped reporting."""

from __future__ import annotations

from clocktower.dashboards.layout import Dashboard, Panel
from clocktower.dashboards.shared_sql import open_incidents
from clocktower.dashboards.variables import NODE_IS

# open now, whatever the range shown: any incident opened in the day before its end
OPEN_INCIDENTS = open_incidents(f"time >= $__toTime - INTERVAL 1 DAY AND time <= $__toTime AND {NODE_IS}")

DASHBOARD = Dashboard(
    uid="clocktower-fleet", title="clocktower: fleet overview",
    question="Is anything wrong right now, what does it cost the training jobs, and which nodes went quiet?",
    panels=(
        Panel("Open incidents", f"SELECT count() AS open_incidents FROM ({OPEN_INCIDENTS})", kind="stat",
              width=6, height=5, description="Incidents opened in the day before the range's end and not resolved by then."),
        Panel("Effective training time", """SELECT sum(baseline_ns) / sum(duration_ns) AS effective
FROM iteration_blame FINAL
WHERE $__timeFilter(time)""", kind="stat", unit="percentunit", width=6, height=5,
              description="The time the iterations would have taken at their job's baseline pace, over the time "
                          "they took: 100% when nothing slowed training down."),
        Panel("Failovers", f"""SELECT count() AS failovers
FROM control_commands FINAL
WHERE $__timeFilter(time) AND action = 'failover' AND {NODE_IS}""", kind="stat", width=6, height=5,
              description="Failover commands issued in the time range."),
        Panel("Nodes silent for over 5 s", f"""SELECT countIf(last < now64(9) - INTERVAL 5 SECOND) AS silent_nodes
FROM (SELECT node, max(time) AS last FROM heartbeats WHERE $__timeFilter(time) AND {NODE_IS} GROUP BY node)""",
              kind="stat", width=6, height=5,
              description="Nodes whose agent sent a heartbeat in the time range but none in the last 5 s."),
        Panel("Open incidents, worst first", f"""SELECT opened, what AS kind, place AS target, level AS severity, latest AS detail
FROM ({OPEN_INCIDENTS})
ORDER BY level = 'critical' DESC, level = 'warning' DESC, opened""", kind="table", width=24, height=7,
              may_be_empty="every fault of the simulated run is resolved by its end"),
        Panel("Incidents opened per interval, by kind", f"""SELECT $__timeInterval(time) AS t, kind, count() AS opened
FROM incidents FINAL
WHERE $__timeFilter(time) AND state = 'open' AND {NODE_IS}
GROUP BY t, kind ORDER BY t""", description="One series per kind of incident."),
        Panel("Effective training time per job", """SELECT $__timeInterval(time) AS t, job, sum(baseline_ns) / sum(duration_ns) AS effective
FROM iteration_blame FINAL
WHERE $__timeFilter(time)
GROUP BY t, job ORDER BY t""", unit="percentunit"),
        Panel("When each node last reported", f"""SELECT node, max(time) AS last_heartbeat,
  dateDiff('millisecond', max(time), now64(3)) / 1000 AS silent_s, argMax(interval_ms, ts_ns) AS period_ms
FROM heartbeats
WHERE $__timeFilter(time) AND {NODE_IS}
GROUP BY node
ORDER BY silent_s DESC""", kind="table", width=24,
              description="Every node's last agent heartbeat: the quiet ones first."),
    ),
)
