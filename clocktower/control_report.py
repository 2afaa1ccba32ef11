"""How the control loop closed in a run: acks by status, commands no node answered, and fault-to-ack times.

Fault to ack is measured per injected fault: from the fault's start to the first `applied` ack of a command that
an incident of the detecting kind, on the fault's node, caused. Both ends are wall-clock stamps (the simulator
runs in real time; the actuators stamp acks on receipt), so it includes detection, the streams, Kafka both ways
and the actuator.
"""

from __future__ import annotations

from collections.abc import Mapping

from clickhouse_connect.driver.client import Client

CLOCK_SLACK_NS = 5 * 10**9   # incidents are stamped on the node's clock, faults on the simulator's true one


def control_loop_report(client: Client, since_ns: int, faults: list[dict], detects: Mapping[str, str]) -> dict:
    acks = {str(k): int(v) for k, v in client.query(
        "SELECT status, count() FROM control_acks WHERE ts_ns >= {s:Int64} AND origin = 'command' GROUP BY status "
        "ORDER BY status", parameters={"s": since_ns}).result_rows}
    watchdog = int(client.query("SELECT count() FROM control_acks WHERE ts_ns >= {s:Int64} AND origin = 'watchdog'",
                                parameters={"s": since_ns}).result_rows[0][0])
    unacked = [str(r[0]) for r in client.query(
        "SELECT command_id FROM control_commands FINAL WHERE ts_ns >= {s:Int64} AND command_id NOT IN "
        "(SELECT command_id FROM control_acks WHERE ts_ns >= {s:Int64}) ORDER BY command_id",
        parameters={"s": since_ns}).result_rows]
    first_ack = {(str(kind), str(node), int(opened)): int(ack) for kind, node, opened, ack in client.query(
        "SELECT i.kind, i.node, i.opened_ns, min(a.ts_ns) FROM control_acks AS a "
        "INNER JOIN (SELECT DISTINCT command_id, incident_id FROM control_commands FINAL "
        "            WHERE ts_ns >= {s:Int64}) AS c ON a.command_id = c.command_id "
        "INNER JOIN (SELECT DISTINCT incident_id, kind, node, opened_ns FROM incidents FINAL "
        "            WHERE ts_ns >= {s:Int64}) AS i ON c.incident_id = i.incident_id "
        "WHERE a.status = 'applied' AND a.ts_ns >= {s:Int64} GROUP BY i.kind, i.node, i.opened_ns",
        parameters={"s": since_ns}).result_rows}
    # An order (an incident's action on a node) that no node applied, whichever of its commands were acked: a
    # drain acked expired and ordered again, then applied, is applied; so is one whose only ack is a copy's
    # `replayed (..., status applied)` (the first ack lost in a crash).
    not_applied = [{"action": str(action), "node": str(node), "acks": sorted(str(s) for s in statuses)}
                   for action, node, statuses in client.query(
        "SELECT c.action, c.node, groupArray(a.status) FROM control_acks AS a INNER JOIN "
        "(SELECT DISTINCT command_id, incident_id, action, node FROM control_commands FINAL WHERE ts_ns >= {s:Int64}) "
        "AS c ON a.command_id = c.command_id WHERE a.ts_ns >= {s:Int64} GROUP BY c.incident_id, c.action, c.node "
        "HAVING countIf(a.status = 'applied' OR a.detail LIKE 'replayed %status applied)') = 0 "
        "ORDER BY c.node, c.action", parameters={"s": since_ns}).result_rows]
    to_ack = []
    for f in faults:
        kind = detects.get(f["kind"], "")
        times = [ack for (k, node, opened), ack in first_ack.items()
                 if k == kind and node == f["node"] and opened >= f["start_ns"] - CLOCK_SLACK_NS]
        if times:
            to_ack.append({"fault_id": f["fault_id"], "kind": f["kind"], "node": f["node"],
                           "fault_to_ack_ms": round((min(times) - f["start_ns"]) / 1e6, 1)})
    return {"control_acks": acks, "watchdog_actions": watchdog, "commands_unacked": unacked, "not_applied": not_applied,
            "fault_to_ack": to_ack}
