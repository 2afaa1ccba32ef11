"""The dashboards' template variables, the filters panels write with them, and the incident annotations.

`$cluster` is a datasource variable: a cluster is one pipeline with its own ClickHouse, so picking a cluster
picks the datasource every panel reads. `$job`, `$node` and `$gpu` are multi-value query variables with "All".
Panels filter with the plugin's `$__conditionalAll(condition, $var)`: with "All" picked it becomes 1=1, so a
fleet of thousands of nodes is not spelled out as an IN list; otherwise the condition, with the picked values
formatted `singlequote` (each quoted; see SAFE_NAME for what that does not cover).
"""

from __future__ import annotations

from clocktower.dashboards.shared_sql import incident_spans

PLUGIN = "grafana-clickhouse-datasource"
PLUGIN_VERSION = "4.20.0"        # pinned in docker-compose.yml's GF_INSTALL_PLUGINS (tests/test_dashboards.py)
DATASOURCE = {"type": PLUGIN, "uid": "${cluster}"}
DEFAULT_DATASOURCE_UID = "clocktower-ch"   # grafana/provisioning/datasources/clickhouse.yaml
PROMETHEUS = {"type": "prometheus", "uid": "${prometheus}"}   # the pipeline's own metrics (self-monitoring)
DEFAULT_PROMETHEUS_UID = "clocktower-prom"   # grafana/provisioning/datasources/prometheus.yaml

NODE_IS = "$__conditionalAll(node IN (${node:singlequote}), $node)"
JOB_IS = "$__conditionalAll(job IN (${job:singlequote}), $job)"
GPU_IS = "$__conditionalAll(toString(gpu) IN (${gpu:singlequote}), $gpu)"

# Grafana's `singlequote` format escapes a quote but not a backslash, and ClickHouse reads a backslash as an
# escape: a value ending in one would end its literal early. So the variable queries offer only names made of
# SAFE_NAME's characters, and the variables take no custom values; whatever a query still gets runs as the
# read-only `dashboards` user.
SAFE_NAME = "^[A-Za-z0-9._:@/+=-]+$"
VARIABLE_SQL = {
    "job": f"SELECT DISTINCT job FROM iterations WHERE $__timeFilter(time) AND match(job, '{SAFE_NAME}') ORDER BY job",
    "node": f"SELECT DISTINCT node FROM heartbeats WHERE $__timeFilter(time) AND match(node, '{SAFE_NAME}') "
            "ORDER BY node",
    "gpu": f"SELECT DISTINCT gpu FROM gpu_health WHERE $__timeFilter(time) AND {NODE_IS} ORDER BY gpu",
}


def _query_variable(name: str) -> dict:
    sql = VARIABLE_SQL[name]
    return {"type": "query", "name": name, "label": name, "datasource": DATASOURCE, "definition": sql,
            "query": {"refId": f"{name}-variable", "queryType": "sql", "rawSql": sql},
            "refresh": 2, "sort": 1, "multi": True, "includeAll": True, "allowCustomValue": False, "hide": 0,
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]}}


def template_variables(names: tuple[str, ...]) -> list[dict]:
    """`cluster` first (the others' queries run on it), then the rest in the order given."""
    if names[:1] != ("cluster",):
        raise ValueError(f"the cluster variable must come first: {names}")
    cluster = {"type": "datasource", "name": "cluster", "label": "cluster", "query": PLUGIN, "refresh": 1,
               "regex": "", "hide": 0, "current": {"selected": True, "text": "clocktower",
                                                    "value": DEFAULT_DATASOURCE_UID}}
    prometheus = {"type": "datasource", "name": "prometheus", "label": "prometheus", "query": "prometheus",
                  "refresh": 1, "regex": "", "hide": 0, "current": {"selected": True, "text": "clocktower-prometheus",
                                                                     "value": DEFAULT_PROMETHEUS_UID}}
    return [cluster, *(prometheus if n == "prometheus" else _query_variable(n) for n in names[1:])]


def _annotation(name: str, color: str, sql: str) -> dict:
    return {"name": name, "enable": True, "iconColor": color, "datasource": DATASOURCE,
            "target": {"refId": "annotation", "datasource": DATASOURCE, "editorType": "sql", "format": 1,
                       "queryType": "table", "pluginVersion": PLUGIN_VERSION, "rawSql": sql}}


# An incident is a region from its opening to its resolution (still open: up to now), tagged with its kind and
# worst severity; a control command is a point. Both follow $node on the dashboards that have it.
def _incident_sql(node_filter: str) -> str:
    return f"""SELECT fromUnixTimestamp64Nano(opened) AS time,
  if(resolved > 0, fromUnixTimestamp64Nano(resolved), now64(9)) AS timeEnd,
  concat(what, ' on ', place, ': ', latest) AS text, [what, level] AS tags
FROM ({incident_spans(f"$__timeFilter(time) AND {node_filter}")})
ORDER BY time"""


def _command_sql(node_filter: str) -> str:
    return f"""SELECT time, concat(action, ' ', target, ' on ', node) AS text, [toString(action)] AS tags
FROM control_commands FINAL
WHERE $__timeFilter(time) AND {node_filter}
ORDER BY time"""


def annotations(names: tuple[str, ...]) -> list[dict]:
    """The built-in one, the incidents and the control commands, filtered by $node where the dashboard has it."""
    node_filter = NODE_IS if "node" in names else "1 = 1"
    return [
        {"builtIn": 1, "name": "Annotations & Alerts", "enable": True, "hide": True,
         "iconColor": "rgba(0, 211, 255, 1)", "type": "dashboard", "datasource": {"type": "grafana", "uid": "-- Grafana --"}},
        _annotation("Incidents", "red", _incident_sql(node_filter)),
        _annotation("Control commands", "blue", _command_sql(node_filter)),
    ]
