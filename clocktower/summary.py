"""The end-of-run summary, read back from ClickHouse and compared with what was produced."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from clickhouse_connect.driver.client import Client

from clocktower.clock_report import clock_sync_report
from clocktower.control_report import control_loop_report
from clocktower.producers.simulator.fault_schedule import KINDS
from clocktower.producers.simulator.node_clock import NodeClock
from clocktower.schemas.topics import BY_SCHEMA, TOPICS

# Which incident kind detects which injected fault kind.
DETECTS = {kind: kind for kind in KINDS}   # each injected kind is detected by the incident kind of its name
WORST = 5   # iterations shown with their blame
T = TypeVar("T")


def table_rows(client: Client) -> dict[str, int]:
    out = {}
    for t in TOPICS:
        final = " FINAL" if t.model.REPLACING else ""
        out[t.table] = int(client.query(f"SELECT count() FROM `{t.table}`{final}").result_rows[0][0])
    return out


def settled(read: Callable[[], dict[str, int]], derive: Callable[[], T], tries: int = 3,
            pause_s: float = 1.0) -> tuple[dict[str, int], T, bool]:
    """`derive()` between two equal `read()`s of the row counts, so that what it reports agrees with them (a
    summary read while rows still arrived said 32,225 flow_latency rows in one place and 33,293 in another).
    After `tries` without two equal reads: the last ones, and False."""
    before = read()
    for attempt in range(tries):
        result = derive()
        after = read()
        if after == before:
            return after, result, True
        before = after
        if attempt + 1 < tries:
            time.sleep(pause_s)
    return before, result, False


def control_errors(control: Mapping[str, Any]) -> list[str]:
    """A command no actuator answered is an error: the demo's nodes all run one (at most 10 ids named). So is one
    a node refused or failed to apply: the demo's nodes can apply every command the pipeline should send."""
    out = []
    unacked = list(control["commands_unacked"])
    if unacked:
        more = " ..." if len(unacked) > 10 else ""
        out.append(f"{len(unacked)} control commands got no ack: {unacked[:10]}{more}")
    not_applied = list(control.get("not_applied", []))
    if not_applied:
        more = " ..." if len(not_applied) > 10 else ""
        out.append(f"{len(not_applied)} ordered actions no node applied: {not_applied[:10]}{more} (the acks' "
                   "details in the control_acks table say why)")
    return out


def build_summary(client: Client, produced: Mapping[str, int], delivery_failures: int,
                  errors: list[str], rows_before: Mapping[str, int], since_ns: int,
                  clocks: Mapping[str, NodeClock] | None = None) -> dict:
    """Rows are counted as growth since `rows_before`; faults and incidents since `since_ns`. With the
    simulator's `clocks`, the clock estimates are also checked against ground truth. Every figure is read between
    two equal row counts (`settled`), so they agree with each other and with `rows`."""
    counts, figures, steady = settled(lambda: table_rows(client), lambda: _figures(client, since_ns, clocks))
    rows = {t: n - rows_before.get(t, 0) for t, n in counts.items()}
    missing = {BY_SCHEMA[s].table: n - rows[BY_SCHEMA[s].table] for s, n in produced.items()
               if n != rows[BY_SCHEMA[s].table]}
    control, clock = figures["control"], figures["clock_sync"]
    errs = list(errors)
    if delivery_failures:
        errs.append(f"{delivery_failures} events failed delivery to Kafka")
    if missing:
        errs.append(f"row counts differ from events produced: {missing}")
    if rows["deadletter"]:
        errs.append(f"{rows['deadletter']} records dead-lettered")
    errs += control_errors(control)
    if not steady:
        errs.append("rows were still arriving while the summary was read: its counts may disagree with each other")
    if clock["flow_latency_rows"] and not clock["flow_latency_corrected"]:
        errs.append("no flow_latency row was clock-corrected: no clock estimates (are probes flowing?)")
    return {
        "events_produced": dict(sorted(produced.items())),
        "rows": rows,
        "faults_injected": figures["faults"],
        "incidents_detected": figures["incidents"],
        "iterations_blamed": figures["blames"],
        "worst_iterations": figures["worst"],
        "control_commands": figures["commands"],
        **control,
        "clock_sync": clock,
        "deadletter": rows["deadletter"],
        "errors": errs,
    }


def _figures(client: Client, since_ns: int, clocks: Mapping[str, NodeClock] | None) -> dict[str, Any]:
    """Everything the summary reports besides the row counts, read in one go."""
    faults = [dict(zip(("fault_id", "kind", "target", "node", "start_ns"), r, strict=True)) for r in client.query(
        "SELECT fault_id, kind, target, node, start_ns FROM faults_injected WHERE ts_ns >= {s:Int64} "
        "ORDER BY start_ns",
        parameters={"s": since_ns}).result_rows]
    incidents = dict(client.query(
        "SELECT kind, uniqExact(incident_id) FROM incidents WHERE state = 'open' AND ts_ns >= {s:Int64} "
        "GROUP BY kind", parameters={"s": since_ns}).result_rows)
    # An incident can change kind on an update (a link_down the watchdog opened becomes a link_flap once the
    # burst is seen): a kind counts as detected from its open or update rows.
    found = client.query(
        "SELECT DISTINCT kind, node, target FROM incidents WHERE state IN ('open', 'update') AND ts_ns >= {s:Int64}",
        parameters={"s": since_ns}).result_rows
    opened = {(k, n) for k, n, _ in found} | {(k, t) for k, _, t in found}
    for f in faults:   # by the faulty node, or by the target (a congestion's incident is the receiver's: "src->dst")
        kind = DETECTS.get(f["kind"], "")
        f["detected"] = (kind, f["node"]) in opened or (kind, f["target"].replace(":", "/", 1)) in opened
    commands = dict(client.query("SELECT action, count() FROM control_commands WHERE ts_ns >= {s:Int64} "
                                 "GROUP BY action", parameters={"s": since_ns}).result_rows)
    worst = [dict(zip(("job", "iteration", "slowdown", "slowest_rank", "node", "blame", "evidence"), r, strict=True))
             for r in client.query(
        "SELECT job, iteration, slowdown, slowest_rank, node, blame, evidence FROM iteration_blame FINAL "
        "WHERE ts_ns >= {s:Int64} ORDER BY slowdown DESC, iteration LIMIT {n:UInt32}",
        parameters={"s": since_ns, "n": WORST}).result_rows]
    blames = dict(client.query("SELECT blame, count() FROM iteration_blame FINAL WHERE ts_ns >= {s:Int64} "
                               "GROUP BY blame", parameters={"s": since_ns}).result_rows)
    return {"faults": faults, "incidents": {k: int(v) for k, v in sorted(incidents.items())},
            "blames": {k: int(v) for k, v in sorted(blames.items())}, "worst": worst,
            "commands": {k: int(v) for k, v in sorted(commands.items())},
            "control": control_loop_report(client, since_ns, faults, DETECTS),
            "clock_sync": clock_sync_report(client, since_ns, clocks)}
