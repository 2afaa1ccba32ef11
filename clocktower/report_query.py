"""What `clocktower report` reads from ClickHouse: one job's time span, as plain rows for report.py to draw.

The span is the job's judged iterations (since `since_ns`, when given). Series are aggregated per interval, about
MAX_POINTS per chart, so a report of a day stays a few MB. Tables a redelivery writes twice are read with FINAL.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from clickhouse_connect.driver.client import Client

from clocktower.dashboards.shared_sql import acks_by_command, incident_spans
from clocktower.runtime.errors import UserError

MAX_POINTS = 300
STRAGGLER = 1.2   # an iteration this many times its job's baseline is marked


@dataclass
class ReportData:
    job: str
    start_ns: int
    end_ns: int
    interval_s: int
    iterations: list[tuple] = field(default_factory=list)    # start, iteration, ms, baseline ms, slowdown, rank, blame
    latency: list[tuple] = field(default_factory=list)       # t, link, p99 µs
    temperature: list[tuple] = field(default_factory=list)   # t, node, max °C, throttled samples
    incidents: list[tuple] = field(default_factory=list)     # opened, resolved|None, kind, severity, target, detail
    commands: list[tuple] = field(default_factory=list)      # time, node, action, target, status, detail


def _rows(client: Client, sql: str, params: dict) -> list[tuple]:
    return [tuple(r) for r in client.query(sql, parameters=params).result_rows]


def read_report(client: Client, job: str, since_ns: int | None) -> ReportData:
    params: dict = {"job": job, "since": since_ns or 0}
    span = _rows(client, "SELECT min(start_ns), max(start_ns + duration_ns), count() FROM iteration_blame FINAL "
                 "WHERE job = {job:String} AND start_ns >= {since:Int64}", params)[0]
    if not span[2]:
        raise UserError(f"no iteration of {job} has been judged" + (" since then" if since_ns else "")
                        + " (iteration_blame has none)")
    start_ns, end_ns = int(span[0]), int(span[1])
    interval_s = max(1, (end_ns - start_ns) // 10**9 // MAX_POINTS)
    params |= {"from": start_ns, "to": end_ns, "step": interval_s}
    window = "ts_ns BETWEEN {from:Int64} AND {to:Int64}"
    bucket = "toStartOfInterval(time, toIntervalSecond({step:UInt32}))"
    data = ReportData(job, start_ns, end_ns, interval_s)
    data.iterations = _rows(client, """
        SELECT fromUnixTimestamp64Nano(start_ns), iteration, duration_ns / 1e6, baseline_ns / 1e6, slowdown,
               slowest_rank, blame
        FROM iteration_blame FINAL WHERE job = {job:String} AND start_ns BETWEEN {from:Int64} AND {to:Int64}
        ORDER BY start_ns""", params)
    data.latency = _rows(client, f"""
        SELECT {bucket} AS t, concat(src_node, ' → ', node) AS link, quantile(0.99)(corrected_latency_ns) / 1000
        FROM flow_latency FINAL WHERE {window} AND clock_corrected
        GROUP BY t, link ORDER BY link, t""", params)
    data.temperature = _rows(client, f"""
        SELECT {bucket} AS t, node, max(temperature_c), countIf(length(throttle) > 0)
        FROM gpu_health WHERE {window} AND NOT lost
        GROUP BY t, node ORDER BY node, t""", params)
    data.incidents = _rows(client, f"""
        SELECT fromUnixTimestamp64Nano(opened), if(resolved > 0, fromUnixTimestamp64Nano(resolved), NULL),
               what, level, place, latest
        FROM ({incident_spans("ts_ns >= {from:Int64} - 86400000000000 AND opened_ns <= {to:Int64}")})
        WHERE resolved = 0 OR resolved >= {{from:Int64}}
        ORDER BY 1""", params)   # open at some time in the span (opened up to a day before it)
    data.commands = _rows(client, f"""
        SELECT c.time, c.node, c.action, c.target, a.ack_status, a.ack_detail
        FROM (SELECT time, node, command_id, action, target FROM control_commands FINAL WHERE {window}) AS c
        LEFT JOIN ({acks_by_command("ts_ns >= {from:Int64}")}) AS a ON c.command_id = a.command_id
        ORDER BY c.time""", params)
    return data
