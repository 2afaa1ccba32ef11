"""SQL the dashboards, the alert rules and `clocktower report` share, so they agree on what an incident or ack is.

- An incident keeps one row per state change (open, update, resolve). It is open while it has an `open` row and no
  `resolve` row; its severity is the worst it reached (its `resolve` row says info: the latest would hide it).
- A command may be acked more than once: a redelivery is refused as `replayed` after it was applied. Its status is
  `applied` if any ack says so, else its first ack's.
"""

from __future__ import annotations

SEVERITIES = "['info', 'warning', 'critical']"
WORST_SEVERITY = f"{SEVERITIES}[max(indexOf({SEVERITIES}, severity))]"


def open_incidents(where: str) -> str:
    """incident_id, what, place, level (worst severity), opened, latest (detail) of the incidents still open among
    the rows `where` selects."""
    return f"""SELECT incident_id, any(kind) AS what, any(target) AS place, {WORST_SEVERITY} AS level,
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
