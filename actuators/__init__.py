"""Node actuators: carry out the pipeline's signed control commands on one node, and acknowledge each.

- actuator.py: verify (control/command_check.py, then replays), apply idempotently, ack; never raises.
- command_consumer.py: the node's own partition of control.commands, through the shared consume loop.
- component.py: the agent component (`clocktower agent --actuate`) and `open_actuator` for the demo.
- link_routing.py (+ route_table.py, simulated_routing.py): moving a link's routes to its backup and back.
- link_watchdog.py: the agent's local failover, without waiting for the pipeline.
- hooks.py (+ hook_examples/): the operator's drain and spare commands; seen_commands.py, quarantine.py: state.
"""
