"""Network: where one-way delay grows, which ports flap, and what the pipeline did about it."""

from __future__ import annotations

from clocktower.dashboards.counters import increase_per_interval
from clocktower.dashboards.layout import Dashboard, Panel
from clocktower.dashboards.shared_sql import acks_by_command
from clocktower.dashboards.variables import NODE_IS

EITHER_END = "$__conditionalAll((node IN (${node:singlequote}) OR src_node IN (${node:singlequote})), $node)"
LINK_ACTIONS = ("failover", "restore", "quarantine", "release")
CONGESTION_ACTIONS = ("qos", "rate_limit", "redirect", "pause", "resume")
NOT_SIMULATED = "the simulator models Ethernet ports and packet samples, not InfiniBand or the agent's flow counters"


def commands_with_acks(actions: tuple[str, ...]) -> str:
    """The commands of these actions, each with its ack (empty status: no ack yet)."""
    listed = ", ".join(f"'{a}'" for a in actions)
    return f"""SELECT c.time AS issued, c.node AS node, c.action AS action, c.target AS target,
  toString(c.params) AS params, a.ack_status AS status, a.ack_detail AS detail, c.incident_id AS incident_id
FROM (SELECT time, node, command_id, action, target, params, incident_id FROM control_commands FINAL
      WHERE $__timeFilter(time) AND action IN ({listed}) AND {NODE_IS}) AS c
LEFT JOIN ({acks_by_command("$__timeFilter(time)")}) AS a ON c.command_id = a.command_id
ORDER BY issued DESC LIMIT 200"""


DASHBOARD = Dashboard(
    uid="clocktower-network", title="clocktower: network",
    question="Which links add one-way delay, which ports flap, and which failovers and congestion actions ran?",
    panels=(
        Panel("One-way delay p99 per link (µs, clock-corrected)", f"""SELECT $__timeInterval(time) AS t, concat(src_node, ' → ', node) AS link,
  quantile(0.99)(corrected_latency_ns) / 1000 AS p99_us
FROM flow_latency FINAL
WHERE $__timeFilter(time) AND clock_corrected AND {EITHER_END}
GROUP BY t, link ORDER BY t""", kind="heatmap", unit="µs", width=24, height=9,
              description="One row per sender → receiver pair, coloured by the p99 of its packets' one-way delay "
                          "after the clock correction."),
        Panel("One-way delay p50 / p99 and clock error bound (µs)", f"""SELECT $__timeInterval(time) AS t,
  quantileIf(0.5)(corrected_latency_ns, clock_corrected) / 1000 AS p50_us,
  quantileIf(0.99)(corrected_latency_ns, clock_corrected) / 1000 AS p99_us,
  max(error_bound_ns) / 1000 AS max_error_bound_us
FROM flow_latency FINAL
WHERE $__timeFilter(time) AND {EITHER_END}
GROUP BY t ORDER BY t""", unit="µs"),
        Panel("One-way delay p99 per link, per minute (µs; rollup, for long ranges)", f"""SELECT minute AS t, concat(src_node, ' → ', node) AS link,
  quantilesTDigestMerge(0.5, 0.9, 0.99)(delay_quantiles_ns)[3] / 1000 AS p99_us
FROM flow_latency_1m
WHERE $__timeFilter(minute) AND {EITHER_END}
GROUP BY t, link ORDER BY t""", unit="µs",
              description="From the flow_latency_1m rollup: days of history without reading the raw rows."),
        Panel("Link availability per port (per-minute rollup)", f"""SELECT minute AS t, concat(node, '/', interface) AS port, sum(up_samples) / sum(samples) AS availability
FROM link_availability_1m
WHERE $__timeFilter(minute) AND {NODE_IS}
GROUP BY t, port ORDER BY t""", unit="percentunit",
              description="The share of each port's samples that were up with carrier, per minute."),
        Panel("Carrier changes per port and interval", increase_per_interval(
            "link_states", "concat(node, '/', interface)", {"changes": "carrier_changes"}, NODE_IS),
              description="Flaps: how often each port's carrier came or went in the interval."),
        Panel("Failovers and restores", commands_with_acks(LINK_ACTIONS), kind="table", width=24, height=7),
        Panel("Congestion actions", commands_with_acks(CONGESTION_ACTIONS), kind="table", width=24, height=7,
              description="QoS, rate limits, redirects, pauses and resumes, each with its ack."),
        Panel("TCP retransmits per node (per second)", f"""SELECT $__timeInterval(time) AS t, node, sum(retransmits) / $__interval_s AS retransmits_per_s
FROM flow_counters
WHERE $__timeFilter(time) AND {NODE_IS}
GROUP BY t, node ORDER BY t""", may_be_empty=NOT_SIMULATED),
        Panel("Top talkers", f"""SELECT toString(src_ip) AS src, toString(dst_ip) AS dst, proto, sum(bytes) AS bytes,
  sum(packets) AS packets, sum(retransmits) AS retransmits
FROM flow_counters
WHERE $__timeFilter(time) AND direction = 'tx' AND {NODE_IS}
GROUP BY src, dst, proto ORDER BY bytes DESC LIMIT 20""", kind="table", unit="bytes",
              may_be_empty=NOT_SIMULATED),
        Panel("InfiniBand errors per port and interval", increase_per_interval(
            "link_states", "concat(node, '/', interface)",
            {"rcv_errors": "port_rcv_errors", "symbol_errors": "symbol_error", "link_downed": "link_downed",
             "xmit_discards": "port_xmit_discards", "error_recovery": "link_error_recovery"},
            f"kind = 'infiniband' AND {NODE_IS}"), may_be_empty=NOT_SIMULATED),
        Panel("InfiniBand throughput per port (bytes/s)", """SELECT t, series, xmit_words * 4 / $__interval_s AS xmit_bytes_per_s,
  rcv_words * 4 / $__interval_s AS rcv_bytes_per_s
FROM (""" + increase_per_interval(
            "link_states", "concat(node, '/', interface)",
            {"xmit_words": "port_xmit_data", "rcv_words": "port_rcv_data"}, f"kind = 'infiniband' AND {NODE_IS}")
              + ")\nORDER BY t", unit="Bps", may_be_empty=NOT_SIMULATED,
              description="port_xmit_data and port_rcv_data count 4-byte words."),
    ),
)
