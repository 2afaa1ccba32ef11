"""What `clocktower explain` reads from ClickHouse: the iterations to explain and the evidence around each.

Without a job, the job whose iteration was judged last; without an iteration, its worst moments (the slowest
iterations, those with a cause found first) since `since_ns`, or over all it has. Every table that a redelivery
writes twice is read with FINAL. Around an iteration means from WINDOW_NS before its start (the flap that slowed
it began earlier) to its end, on the nodes of its ranks.
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime

import orjson
from clickhouse_connect.driver.client import Client

from clocktower.dashboards.shared_sql import acks_by_command, incident_spans
from clocktower.explain import Command, Explanation, FlowDelay, IncidentSpan, Iteration, RankTime
from clocktower.runtime.errors import UserError

WINDOW_NS = 10 * 10**9        # incidents and commands from this long before the iteration's start
BASELINE_NS = 60 * 10**9      # a flow's baseline: its p99 one-way delay over this long before the iteration
FLOWS = 3                     # the slowest rank's flows shown, worst p99 first
_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|m|h|d)$")


def parse_since(text: str, now_ns: int | None = None) -> int:
    """`15m`, `2h`, `1d` (ago), or an ISO time (`2026-12-07T03:12:00`, UTC unless it names a zone), in ns."""
    now_ns = time.time_ns() if now_ns is None else now_ns
    m = _RELATIVE.match(text.strip())
    if m:
        return now_ns - int(float(m[1]) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m[2]] * 10**9)
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise UserError(f"--since {text!r} is neither a duration ago (15m, 2h, 1d) nor an ISO time") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp() * 10**9)


def latest_job(client: Client) -> str:
    rows = client.query("SELECT job FROM iteration_blame FINAL ORDER BY ts_ns DESC LIMIT 1").result_rows
    if not rows:
        raise UserError("no iteration has been judged yet (iteration_blame is empty): run `clocktower demo`, or a "
                        "job with the PyTorch hook, first")
    return str(rows[0][0])


def iterations(client: Client, job: str, iteration: int | None, since_ns: int | None, limit: int) -> list[Iteration]:
    where, params = "job = {job:String}", {"job": job, "n": limit}
    if iteration is not None:
        where += " AND iteration = {it:UInt64}"
        params["it"] = iteration
    elif since_ns is not None:
        where += " AND start_ns >= {since:Int64}"
        params["since"] = since_ns
    rows = client.query(
        "SELECT job, iteration, start_ns, duration_ns, baseline_ns, slowdown, slowest_rank, node, slowest_gpu, "
        "blame, slowest_compute_ns, median_compute_ns, median_comm_ns, evidence FROM iteration_blame FINAL "
        f"WHERE {where} ORDER BY blame = 'none', slowdown DESC, iteration LIMIT {{n:UInt32}}",
        parameters=params).result_rows
    if not rows:
        what = f"iteration {iteration} of {job} has" if iteration is not None else f"no iteration of {job} has"
        raise UserError(("no " if iteration is not None else "") + f"{what} been judged"
                        + (" since then" if since_ns is not None else "") + " (iteration_blame has none)")
    return [Iteration(*r[:13], evidence=_json(r[13])) for r in rows]


def explain(client: Client, it: Iteration) -> Explanation:
    end = it.start_ns + it.duration_ns
    params = {"job": it.job, "it": it.iteration, "from": it.start_ns - WINDOW_NS, "start": it.start_ns, "end": end,
              "node": it.node, "base": it.start_ns - BASELINE_NS}
    ranks = [RankTime(*r) for r in client.query(
        "SELECT rank, node, compute_ns, comm_ns FROM iteration_breakdown FINAL "
        "WHERE job = {job:String} AND iteration = {it:UInt64} ORDER BY rank", parameters=params).result_rows]
    nodes = sorted({r.node for r in ranks} | {it.node})
    params["nodes"] = nodes
    flows = [FlowDelay(src, dst, int(p99), int(base) if base else None, int(n))
             for src, dst, p99, n, base in client.query(
        "SELECT f.src_node, f.node, f.p99, f.n, b.p99 FROM ("
        " SELECT src_node, node, quantile(0.99)(corrected_latency_ns) AS p99, count() AS n FROM flow_latency FINAL"
        " WHERE clock_corrected AND rx_ns >= {start:Int64} AND rx_ns <= {end:Int64}"
        " AND (src_node = {node:String} OR node = {node:String}) GROUP BY src_node, node) AS f "
        "LEFT JOIN ("
        " SELECT src_node, node, quantile(0.99)(corrected_latency_ns) AS p99 FROM flow_latency FINAL"
        " WHERE clock_corrected AND rx_ns >= {base:Int64} AND rx_ns < {start:Int64}"
        " AND (src_node = {node:String} OR node = {node:String}) GROUP BY src_node, node) AS b "
        "ON b.src_node = f.src_node AND b.node = f.node "
        "ORDER BY f.p99 DESC LIMIT " + str(FLOWS), parameters=params, settings={"join_use_nulls": 1}).result_rows]
    incidents = [IncidentSpan(*r[:6], r[6] or None, r[7]) for r in client.query(
        "SELECT incident_id, what, at_node, place, level, opened, resolved, latest "
        f"FROM ({incident_spans('opened_ns <= {end:Int64}')}) "
        "WHERE (resolved = 0 OR resolved >= {from:Int64}) "
        " AND (at_node IN {nodes:Array(String)} OR arrayExists(n -> startsWith(place, concat(n, '/')), "
        " {nodes:Array(String)}) OR startsWith(place, concat({job:String}, ':'))) "
        "ORDER BY at_node = {node:String} DESC, opened DESC LIMIT 20", parameters=params).result_rows]
    incidents.sort(key=lambda i: i.opened_ns)
    commands: list[Command] = []
    if incidents:
        params["ids"] = [i.incident_id for i in incidents]
        commands = [Command(*r[:5], r[5] or None) for r in client.query(
            "SELECT c.incident_id, c.action, c.node, c.target, c.ts_ns, a.ack_status "
            f"FROM control_commands AS c FINAL LEFT JOIN ({acks_by_command('1')}) AS a ON a.command_id = c.command_id "
            "WHERE c.incident_id IN {ids:Array(String)} ORDER BY c.ts_ns LIMIT 20", parameters=params,
            settings={"join_use_nulls": 1}).result_rows]
    return Explanation(it, ranks, flows, incidents, commands)


def _json(text: str) -> dict:
    try:
        value = orjson.loads(text) if text else {}
    except orjson.JSONDecodeError:
        return {"raw": text}
    return value if isinstance(value, dict) else {"value": value}
