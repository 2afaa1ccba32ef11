"""Control events: commands to node actuators, and their acknowledgements."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from clocktower.schemas.column_types import Name, Text, TimestampNs
from clocktower.schemas.event import Event

Action = Literal["failover", "restore", "qos", "rate_limit", "pause", "resume", "drain", "spare"]


class ControlCommand(Event):
    """A signed instruction for exactly one node (`node`), valid until `expires_ns`.

    `signature` is an HMAC over every other field (see control/signing.py);
    actuators refuse unsigned, expired, foreign or replayed commands. Defaults that are true values:
    `params` {} (the action takes none), `incident_id` "" (issued by hand, not for an incident).
    """

    SCHEMA = "control_command"
    ORDER_BY = ("node", "command_id")
    REPLACING = True

    command_id: Name
    action: Action
    target: Name
    params: dict[str, str] = Field(default_factory=dict, max_length=64)
    incident_id: str = Field(default="", max_length=256)
    expires_ns: TimestampNs
    signature: Name


class ControlAck(Event):
    """An actuator's answer to one command. `detail` is free text ("" = none)."""

    SCHEMA = "control_ack"
    ORDER_BY = ("node", "ts_ns")

    command_id: Name
    status: Literal["applied", "rejected", "failed"]
    detail: Text = ""
