"""SQL the dashboards, the alert rules and `clocktower report` share, so they agree on what an incident or ack is.

- An incident keeps one row per state change (open, update, resolve). It is open while it has an `open` row and no
  `resolve` row; its severity is the worst it reached (its `resolve` row says info: the latest would hide it). Its
  kind and target are the latest: a `link_down` whose link goes on flapping becomes a `link_flap`.
- A command may be acked more than once: a redelivery is refused as `replayed` after it was applied. Its status is
  `applied` if any ack says so, else its first ack's.
"""

from __future__ import annotations

SEVERITIES = "['info', 'warning', 'critical']"
WORST_SEVERITY = f"{SEVERITIES}[max(indexOf({SEVERITIES}, severity))]"


def incident_spans(where: str) -> str:
    """One row per incident among the rows `where` selects: incident_id, what (its kind), at_node, place (its latest
    target), level (worst severity), opened and resolved (ns; 0 while open) and latest (its latest detail). No alias
    is a column's name: ClickHouse would read the aggregate in `where`."""
    return f"""SELECT incident_id, toString(argMax(kind, ts_ns)) AS what, any(node) AS at_node,
  toString(argMax(target, ts_ns)) AS place, {WORST_SEVERITY} AS level, min(opened_ns) AS opened,
  maxIf(ts_ns, state = 'resolve') AS resolved, argMax(detail, ts_ns) AS latest
FROM incidents FINAL
WHERE {where}
GROUP BY incident_id"""


def open_incidents(where: str) -> str:
    """incident_id, what, place, level (worst severity), opened, latest (detail) of the incidents still open among
    the rows `where` selects; and first_what, first_place (its kind and target when it opened: an alert's labels,
    which must not change while it fires)."""
    return f"""SELECT incident_id, toString(argMax(kind, ts_ns)) AS what, toString(argMax(target, ts_ns)) AS place,
  toString(argMin(kind, ts_ns)) AS first_what, toString(argMin(target, ts_ns)) AS first_place, {WORST_SEVERITY} AS level,
  fromUnixTimestamp64Nano(min(opened_ns)) AS opened, argMax(detail, ts_ns) AS latest
FROM incidents FINAL
WHERE {where}
GROUP BY incident_id
HAVING countIf(state = 'open') > 0 AND countIf(state = 'resolve') = 0"""


def acks_by_command(where: str) -> str:
    """Per command_id among the acks `where` selects: ack_status, ack_detail, ack_origin, acked_ns (its first ack's
    time), applied_ns (how long applying took)."""
    return f"""SELECT command_id,
  if(countIf(status = 'applied') > 0, 'applied', toString(argMin(status, ts_ns))) AS ack_status,
  if(countIf(status = 'applied') > 0, argMinIf(detail, ts_ns, status = 'applied'), argMin(detail, ts_ns)) AS ack_detail,
  toString(argMin(origin, ts_ns)) AS ack_origin, min(ts_ns) AS acked_ns, max(apply_ns) AS applied_ns
FROM control_acks
WHERE {where}
GROUP BY command_id"""
