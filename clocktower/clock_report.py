"""The clock-sync part of the demo summary: what was estimated, how many flows it corrected, and, when the
simulator's ground-truth clocks are at hand, how far off the estimates and corrected latencies really were."""

from __future__ import annotations

from collections.abc import Mapping

from clickhouse_connect.driver.client import Client

from clocktower.producers.simulator.node_clock import NodeClock


def _quantiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    v = sorted(values)
    return {"p50": round(v[len(v) // 2], 1), "p99": round(v[int(0.99 * (len(v) - 1))], 1), "max": round(v[-1], 1)}


def clock_sync_report(client: Client, since_ns: int, clocks: Mapping[str, NodeClock] | None = None) -> dict:
    est = client.query(
        "SELECT node, reference, ts_ns, offset_ns, error_bound_ns FROM clock_estimates "
        "WHERE ts_ns >= {s:Int64}", parameters={"s": since_ns}).result_rows
    total, corrected = client.query(
        "SELECT count(), countIf(clock_corrected) FROM flow_latency FINAL WHERE ts_ns >= {s:Int64}",
        parameters={"s": since_ns}).result_rows[0]
    flows = client.query(
        "SELECT src_node, node, tx_ns, rx_ns, corrected_latency_ns, error_bound_ns FROM flow_latency FINAL "
        "WHERE ts_ns >= {s:Int64} AND clock_corrected LIMIT 200000", parameters={"s": since_ns}).result_rows
    first: dict[str, int] = {}
    for node, _, ts, _, _ in est:
        first[node] = min(first.get(node, ts), ts)
    ready_ns = max(first.values(), default=0)    # every estimated node has had an estimate since (event time)
    ready_total, ready_corrected = client.query(
        "SELECT count(), countIf(clock_corrected) FROM flow_latency FINAL WHERE ts_ns >= {s:Int64}",
        parameters={"s": max(since_ns, ready_ns)}).result_rows[0] if first else (0, 0)
    report: dict = {
        "nodes_estimated": len({r[0] for r in est}),
        "estimates": len(est),
        "reference": sorted({r[1] for r in est}),
        "flow_latency_rows": int(total),
        "flow_latency_corrected": int(corrected),
        # the rows dated after every node's first estimate: the ones before cannot be corrected, and how many
        # there are depends on how fast the first estimates come (load); these show whether the join uses them
        "after_first_estimates": {"rows": int(ready_total), "corrected": int(ready_corrected)},
        "corrected_latency_ns": _quantiles([float(f[4]) for f in flows]),
        "error_bound_ns": _quantiles([float(f[5]) for f in flows]),
    }
    if clocks:
        errors, within = [], 0
        est = [r for r in est if r[0] in clocks and r[1] in clocks]      # this run's simulated nodes only
        flows = [f for f in flows if f[0] in clocks and f[1] in clocks]
        for node, ref, ts, offset, bound in est:
            t = clocks[ref].to_true(ts)
            err = abs(offset - (clocks[node].offset_ns(t) - clocks[ref].offset_ns(t)))
            errors.append(err)
            within += err <= bound + 1
        lat_err, lat_within, ready_err = [], 0, []
        for src, dst, tx, rx, lat, bound in flows:
            err = abs(lat - (clocks[dst].to_true(rx) - clocks[src].to_true(tx)))
            lat_err.append(err)
            lat_within += err <= bound + 2
            if rx >= ready_ns:
                ready_err.append(err)
        report["vs_ground_truth"] = {
            "offset_error_ns": _quantiles(errors),
            "offset_within_bound": round(within / len(est), 4) if est else None,
            "latency_error_ns": _quantiles(lat_err),
            "latency_within_bound": round(lat_within / len(flows), 4) if flows else None,
            # the rows dated before the first estimates are converted with them, far ahead: a larger error
            "latency_error_after_first_estimates_ns": _quantiles(ready_err),
        }
    return report
