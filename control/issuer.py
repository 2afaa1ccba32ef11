"""Turns command intents into signed commands, with a deterministic id, so a replayed detector re-issues the same.

A command is valid for `ttl_ns` from when it is issued, not from its fault's event time: streams that lag behind
a fault (a loaded worker, a restart, a report that came late) still send commands a node can apply. How old a fault
may be and still be acted on is decided per action:
- drain and spare: where they are decided, by the replacement allocator (`max_fault_age_ns`, 15 min by default);
- failover and restore: `ttl_ns` (`STALE_AFTER_NS`). They act on a link's state as a report showed it, and a later
  one may show it otherwise: the node's own watchdog fails a link over at once, and the link detector orders a
  restore again from later reports. So one for a report older than that is issued already expired (valid until its
  event time + `ttl_ns`, as before): the node refuses it and its ack says so. A quarantine (decided from an hour's
  count) and a release (an operator's) are dated from issue.
The lifetime the actuators accept (control/command_check.py, MAX_LIFETIME_NS from the event time) caps every
expiry.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from clocktower.control.command_check import MAX_LIFETIME_NS
from clocktower.control.intent import CommandIntent, command_id_of
from clocktower.control.signing import CommandSigner
from clocktower.schemas.control import ControlCommand
from clocktower.schemas.event import Event

DEFAULT_TTL_NS = 60 * 10**9
STALE_AFTER_NS = dict.fromkeys(("failover", "restore"), DEFAULT_TTL_NS)


class CommandIssuer:
    """Holds the private control key: with the operator's CLI, the only place that does."""

    def __init__(self, signer: CommandSigner, ttl_ns: int = DEFAULT_TTL_NS,
                 clock_ns: Callable[[], int] = time.time_ns) -> None:
        self.signer = signer
        self.ttl_ns = ttl_ns
        self.clock_ns = clock_ns   # the issuer's wall clock; tests inject their own

    def expiry_of(self, intent: CommandIntent) -> int:
        """`ttl_ns` after now (or after the intent's time, if that is later), within the actuators' lifetime; for an
        intent older than its action's STALE_AFTER_NS, `ttl_ns` after its event time (expired on arrival)."""
        now = self.clock_ns()
        if now - intent.ts_ns > STALE_AFTER_NS.get(intent.action, MAX_LIFETIME_NS):
            return intent.ts_ns + self.ttl_ns
        return min(max(intent.ts_ns, now) + self.ttl_ns, intent.ts_ns + MAX_LIFETIME_NS)

    def issue(self, intent: CommandIntent) -> ControlCommand:
        """The signed command for `intent`: valid for `ttl_ns` from now."""
        i = intent
        unsigned = ControlCommand(
            node=i.node, ts_ns=i.ts_ns, command_id=command_id_of(i), action=i.action, target=i.target,
            params=dict(i.params), incident_id=i.incident_id, expires_ns=self.expiry_of(i), signature="-",
        )
        return unsigned.model_copy(update={"signature": self.signer.signature_of(unsigned)})

    def signed(self, derived: Iterable[Event | CommandIntent]) -> list[Event]:
        """`derived` with every intent replaced by its signed command, in order: the streams' edge step."""
        return [self.issue(e) if isinstance(e, CommandIntent) else e for e in derived]
