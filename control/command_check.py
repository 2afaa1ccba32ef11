"""Why an actuator must refuse a command, if it must: the checks that need only the command, the public key and
the node's clock. Replays need the actuator's memory of ids (actuators/) and are checked there, after these.
"""

from __future__ import annotations

from clocktower.control.signing import CommandVerifier
from clocktower.schemas.control import ControlCommand

MAX_LIFETIME_NS = 3600 * 10**9   # a command valid for longer is refused: it bounds how long ids must be remembered
MAX_FUTURE_NS = 30 * 10**9       # a command dated further ahead of this node's clock is refused (node clocks must
                                 # agree within 30 s: README, clock sync); else a command dated a day ahead, with
                                 # an expiry to match, passed the lifetime check and was applied (issue 18)


def refusal(cmd: ControlCommand, *, node: str, now_ns: int, verifier: CommandVerifier) -> str | None:
    """None when `cmd` may be applied on `node` at `now_ns`; else the reason, in words for the ack."""
    if not cmd.signature or cmd.signature == "-":
        return "unsigned"
    if not verifier.verify(cmd):
        return "bad signature: not signed by the controller's key, or altered after signing"
    if cmd.node != node:
        return f"scoped to node {cmd.node!r}, not to this node {node!r}"
    if cmd.ts_ns > now_ns + MAX_FUTURE_NS:
        return (f"dated {(cmd.ts_ns - now_ns) / 1e9:.0f} s ahead of this node's clock, more than the "
                f"{MAX_FUTURE_NS // 10**9} s allowed")
    if cmd.expires_ns <= now_ns:
        return f"expired {(now_ns - cmd.expires_ns) / 1e9:.3f} s ago"
    if cmd.expires_ns - cmd.ts_ns > MAX_LIFETIME_NS:
        return (f"valid for {(cmd.expires_ns - cmd.ts_ns) / 1e9:.0f} s, more than the "
                f"{MAX_LIFETIME_NS // 10**9} s allowed")
    return None
