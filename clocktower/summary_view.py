"""The demo's end-of-run summary for a person: a few lines under the live table (`--json` prints all of it)."""

from __future__ import annotations

from collections.abc import Mapping

import orjson
from rich.console import Group
from rich.markup import escape
from rich.table import Table


def _counts(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{k} {v:,}" for k, v in counts.items()) or "none"


def _evidence(text: str, limit: int = 90) -> str:
    """An evidence JSON object as `key=value, ...` (cut to `limit`), for a person."""
    try:
        items = orjson.loads(text).items() if text else []
    except (orjson.JSONDecodeError, AttributeError):
        return text[:limit]
    return ", ".join(f"{k}={v}" for k, v in items if k not in ("slowest_rank", "slowest_node"))[:limit]


def render_summary(summary: Mapping) -> Group:
    """Faults and whether each was detected, the slowest iterations and their blame, incidents, commands, clock
    sync, then errors or `ok`."""
    faults = Table(title="faults injected", show_edge=False)
    for col in ("kind", "target", "detected"):
        faults.add_column(col)
    for f in summary["faults_injected"]:
        faults.add_row(escape(f["kind"]), escape(f["target"]), "[green]yes[/green]" if f["detected"] else
                       "[red]no[/red]")
    worst = Table(title="slowest iterations and why", show_edge=False)
    for col in ("job", "iteration", "slowdown", "slowest rank", "blame", "evidence"):
        worst.add_column(col)
    for w in summary.get("worst_iterations", []):
        worst.add_row(escape(w["job"]), str(w["iteration"]), f"{w['slowdown']:.2f}x",
                      f"{w['slowest_rank']} ({escape(w['node'])})", escape(w["blame"]),
                      escape(_evidence(w["evidence"])))
    clock = summary["clock_sync"]
    lines = [
        f"incidents: {escape(_counts(summary['incidents_detected']))}",
        f"control commands: {escape(_counts(summary['control_commands']))}; acks: "
        f"{escape(_counts(summary['control_acks']))}; local watchdog actions: {summary['watchdog_actions']}",
        f"events produced {sum(summary['events_produced'].values()):,}, rows stored "
        f"{sum(summary['rows'].values()):,}, dead letters {summary['deadletter']:,}",
        f"clock sync: {clock['nodes_estimated']} nodes against {escape(', '.join(clock['reference']) or '-')}, "
        f"{clock['flow_latency_corrected']:,} of {clock['flow_latency_rows']:,} flow latencies corrected",
    ]
    to_ack = sorted(f["fault_to_ack_ms"] for f in summary["fault_to_ack"])
    if to_ack:
        lines.append(f"  fault to ack: {len(to_ack)} faults, {to_ack[0]:,.0f} to {to_ack[-1]:,.0f} ms")
    truth = clock.get("vs_ground_truth")
    if truth and truth["offset_error_ns"]:
        lines.append(f"  vs ground truth: offset error p99 {truth['offset_error_ns']['p99']:,} ns, "
                     f"latency error p99 {truth['latency_error_ns'].get('p99', '-')} ns")
    errors = summary["errors"]
    lines += [f"[red]error:[/red] {escape(e)}" for e in errors] or ["[green]ok[/green]: no errors"]
    lines.append("[dim]the whole summary as JSON: clocktower demo --json[/dim]")
    return Group(faults, *([worst] if summary.get("worst_iterations") else []), *lines)
