"""Control: every command the pipeline signed, what each node answered, and how long it took."""

from __future__ import annotations

from clocktower.dashboards.layout import Dashboard, Panel
from clocktower.dashboards.shared_sql import acks_by_command
from clocktower.dashboards.variables import NODE_IS

# Each command with its ack; ack.ts_ns and command.ts_ns are two machines' clocks (the node's, the worker's): close
# enough for the seconds an operator looks at, not for microseconds. No ack yet: status '' and no times.
ACKED = f"""SELECT c.time AS issued, c.node AS node, c.action AS action, c.target AS target, c.command_id AS command_id,
  a.ack_status AS status, a.ack_detail AS detail, a.ack_origin AS origin,
  if(a.command_id = '', NULL, (a.acked_ns - c.ts_ns) / 1e6) AS ack_ms, if(a.command_id = '', NULL, a.applied_ns / 1e6) AS apply_ms
FROM (SELECT time, ts_ns, node, command_id, action, target FROM control_commands FINAL
      WHERE $__timeFilter(time) AND {NODE_IS}) AS c
LEFT JOIN ({acks_by_command("$__timeFilter(time)")}) AS a ON c.command_id = a.command_id"""

DASHBOARD = Dashboard(
    uid="clocktower-control", title="clocktower: control",
    question="What did the pipeline order, did every node apply it, and what was refused or failed?",
    panels=(
        Panel("Commands and their acks", f"""SELECT issued, node, action, target, if(status = '', 'no ack', status) AS status,
  round(ack_ms, 1) AS ack_ms, detail, command_id
FROM ({ACKED})
ORDER BY issued DESC LIMIT 200""", kind="table", width=24, height=9),
        Panel("Acks per interval, by status", f"""SELECT $__timeInterval(time) AS t, status, count() AS acks
FROM control_acks
WHERE $__timeFilter(time) AND {NODE_IS}
GROUP BY t, status ORDER BY t"""),
        Panel("Command to ack (ms), by action", f"""SELECT $__timeInterval(issued) AS t, action, max(ack_ms) AS worst_ms, avg(apply_ms) AS apply_ms
FROM ({ACKED})
WHERE status != ''
GROUP BY t, action ORDER BY t""", unit="ms",
              description="From the command's signing to the node's ack, and how long applying took on the node."),
        Panel("Refused and failed", f"""SELECT time, node, action, target, status, origin, detail, command_id
FROM control_acks
WHERE $__timeFilter(time) AND status != 'applied' AND {NODE_IS}
ORDER BY time DESC
LIMIT 1 BY command_id, status
LIMIT 200""", kind="table", width=24,
              may_be_empty="the simulated actuators apply every signed command",
              description="What a node would not or could not do: a bad signature, an expired lease, no path."),
        Panel("Replacement requests", f"""SELECT time, node, incident_id, reason, gpu, approval
FROM replacement_requests FINAL
WHERE $__timeFilter(time) AND {NODE_IS}
ORDER BY time DESC LIMIT 100""", kind="table", width=24, height=6),
    ),
)
