"""Control events: commands to node actuators, and their acknowledgements."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from clocktower.schemas.analytics import IncidentKind
from clocktower.schemas.column_types import Name, Text, TimestampNs, UInt8, UInt64
from clocktower.schemas.event import Event

Action = Literal["failover", "restore", "quarantine", "release", "qos", "rate_limit", "pause", "resume", "redirect",
                 "drain", "spare", "undrain"]


class ControlCommand(Event):
    """A signed instruction for exactly one node (`node`), valid until `expires_ns`.

    `signature` is an Ed25519 signature (base64url) over every other field (control/signing.py): only the
    streams (and the operator's CLI) hold the private key, actuators only the public one, so no node can forge a
    command. Actuators refuse unsigned, expired, foreign or replayed commands. Defaults that are true values:
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
    """An actuator's answer to one command, or a report of what the node's own watchdog did.

    `status`: "applied" (done, or already so: applying is idempotent), "refused" (not verified or not allowed:
    forged, expired, replayed, foreign, malformed, quarantined; the node is unchanged) or "failed" (verified, but
    applying it failed). `detail` says why or what was done ("" = nothing to add). `origin` "watchdog" is a
    local failover the agent made by itself, without a command (`command_id` is then the watchdog's own id).
    `apply_ns` is how long applying took on the node (0 when nothing was applied). `action`/`target` repeat
    the command's, so acks can be read without a join ("" when a malformed command gave none).
    """

    SCHEMA = "control_ack"
    ORDER_BY = ("node", "ts_ns")

    command_id: Name
    status: Literal["applied", "refused", "failed"]
    detail: Text = ""
    action: Literal[Action, ""] = ""
    target: str = Field(default="", max_length=256)
    origin: Literal["command", "watchdog"] = "command"
    apply_ns: UInt64 = 0


class ReplacementRequest(Event):
    """A node to drain and replace with a spare (`node`: the faulty node), asked of the fleet's allocator.

    The GPU detector runs per node and cannot see the other nodes' replacements, so it asks; the allocator
    (streams/detectors/replacement_allocator.py, one key for the whole fleet) grants it within the fleet's
    budget, picks a spare no other replacement holds, and orders the `drain` and `spare` commands.
    `incident_id` is the incident that asked; `gpu` the GPU that failed. `approval` is set only on an operator's
    approval of a request the budget withheld (`clocktower control approve`): the control key's signature of the
    request (control/approval.py), which the allocator checks before it orders anything outside the budget.
    """

    SCHEMA = "replacement_request"
    ORDER_BY = ("node", "incident_id")
    REPLACING = True

    incident_id: Name
    reason: IncidentKind
    gpu: UInt8
    known_for_ns: UInt64 = Field(default=0, description="how long the failing GPU had been reporting to the "
                                 "streams when it failed (event time): the allocator spends the fleet's budget only "
                                 "on a node known this long (CLOCKTOWER_STREAMS_KNOWN_AFTER_S) or listed")
    approval: str = Field(default="", pattern=r"^([A-Za-z0-9_-]{86})?$",
                          description="an operator's approval of a withheld request: the control key's Ed25519 "
                          "signature of it (base64url); empty on the detectors' requests")
