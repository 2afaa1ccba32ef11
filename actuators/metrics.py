"""The actuator's Prometheus metrics, served by the agent it runs in (CLOCKTOWER_AGENT_METRICS_PORT).

Command to ack is measured for commands applied or failed (not refused: forged, replayed, expired), from the
command's `ts_ns` (the issuing stream worker's clock) to the ack (this node's
clock): two machines' clocks, good to the milliseconds an operator reads, not to microseconds.
"""

from prometheus_client import Counter, Histogram

BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
COMMANDS = Counter("clocktower_actuator_commands_total", "commands acked, by action and status",
                   ["action", "status"])
COMMAND_TO_ACK = Histogram("clocktower_actuator_command_to_ack_seconds",
                           "from a command's timestamp to its ack, by action", ["action"], buckets=BUCKETS)
APPLY = Histogram("clocktower_actuator_apply_seconds", "time applying a command on the node, by action",
                  ["action"], buckets=BUCKETS)
