"""Grafana alert rules for what needs a person: a critical incident still open, a node gone quiet, dead letters.

Each rule's query returns one row per alert instance (string columns become its labels, the number its value);
the threshold fires on a value above 0. Rules read the provisioned datasource (alert rules have no variables).
"""

from __future__ import annotations

from dataclasses import dataclass

from clocktower.dashboards.shared_sql import open_incidents
from clocktower.dashboards.variables import DEFAULT_DATASOURCE_UID, PLUGIN_VERSION


@dataclass(frozen=True)
class AlertRule:
    uid: str
    title: str
    sql: str
    summary: str
    severity: str
    window_s: int = 600      # the query's time range: $__timeFilter covers the last `window_s` seconds


DAY_S = 86_400
RULES: tuple[AlertRule, ...] = (
    # over a day: an incident opened hours ago and still open keeps firing; one instance per kind and target, as
    # opened (a link_down that goes on to flap stays one alert, not a resolved one and a new one)
    AlertRule("clocktower-critical-incident", "Critical incident open", f"""SELECT first_what AS kind, first_place AS target, count() AS open
FROM ({open_incidents("$__timeFilter(time)")})
WHERE level = 'critical'
GROUP BY kind, target""", "{{ $labels.kind }} on {{ $labels.target }} is open and critical", "critical",
              window_s=DAY_S),
    # every node seen in the last day and not in the last 30 s (node_last_seen: one row per node, not 5 a second)
    AlertRule("clocktower-node-silent", "Node stopped reporting", """SELECT node, dateDiff('second', max(last_seen), now64(9)) AS silent_s
FROM node_last_seen
GROUP BY node
HAVING max(last_seen) >= now64(9) - INTERVAL 1 DAY AND silent_s > 30""",
              "{{ $labels.node }} sent no heartbeat for {{ $values.A }} s", "critical"),
    AlertRule("clocktower-dead-letters", "Records dead-lettered", """SELECT origin_topic, count() AS dead_letters
FROM deadletter FINAL
WHERE $__timeFilter(time)
GROUP BY origin_topic""", "{{ $values.A }} records from {{ $labels.origin_topic }} were dead-lettered", "warning",
              window_s=300),
)


def provisioning() -> dict:
    """The alerting provisioning file (grafana/provisioning/alerting/)."""
    return {"apiVersion": 1, "groups": [{
        "orgId": 1, "name": "clocktower", "folder": "clocktower", "interval": "1m",
        "rules": [_rule(r) for r in RULES]}]}


def _rule(r: AlertRule) -> dict:
    query = {"refId": "A", "editorType": "sql", "format": 1, "queryType": "table", "rawSql": r.sql,
             "pluginVersion": PLUGIN_VERSION}
    threshold = {"refId": "C", "type": "threshold", "expression": "A",
                 "conditions": [{"evaluator": {"type": "gt", "params": [0]}}]}
    return {"uid": r.uid, "title": r.title, "condition": "C", "for": "0s", "noDataState": "OK",
            "execErrState": "Error", "labels": {"severity": r.severity}, "annotations": {"summary": r.summary},
            "data": [{"refId": "A", "relativeTimeRange": {"from": r.window_s, "to": 0},
                      "datasourceUid": DEFAULT_DATASOURCE_UID, "model": query},
                     {"refId": "C", "datasourceUid": "__expr__", "model": threshold}]}
