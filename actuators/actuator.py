"""The node's actuator: verify one control command, apply it idempotently, and say what happened in a ControlAck.

Order for each command (the consumer, command_consumer.py, does the last two):
1. refuse what must not be applied: unsigned, forged or altered, for another node, expired, valid for too long
   (control/command_check.py); then a replay (an id already handled, remembered on disk: seen_commands.py).
   None of these is recorded or changes the node;
2. record the id as started (fsynced);
3. apply it (routes through `LinkRouting`, quarantine marks, the operator's hooks);
4. record the outcome (applied or failed, fsynced);
5. publish the ack (the agent's spooling publisher: it is not lost while the broker is away);
6. commit the record's offset.
A crash between 2 and 4 leaves the id "started": the redelivered command is applied again, which is safe as every
action is idempotent. A crash between 4 and 6 gives a redelivered command a `refused` "replayed" ack that names
the first outcome. `handle` never raises: an error while applying is a `failed` ack with the reason.

Params (streams/detectors/link_flap.py): failover and quarantine {"from": link, "to": backup}; restore and release
{"from": backup, "to": link}; the target is the link in all four. A release naming no backup uses the one kept
with the quarantine mark. The backup a command names is checked against the node's own (`backups`: configured, or
discovered from its routes), never obeyed: a signed command built from a forged link report once named `lo`, and
moving a node's default route there blackholes it.

QoS (streams/detectors/congestion.py): `rate_limit` {"share": "0.25"}, `pause` and `resume`, target "low": the low
traffic class's share of this node's shaped links (control/traffic_class.py), applied by its `TrafficShaper`. A
limit is held for its `lease_s` param (qos_leases.py) and lifted when that runs out with no renewal: a lost `resume`
does not cap the node for good. `expire_leases` lifts them (the command consumer calls it before each fetch). A cap
found in place at start (an actuator that died holding one) is held for one default lease, then lifted.

`redirect` {"dst": addresses, "share", "lease_s"}, target "low": the low class toward those addresses leaves by
the alternate port of the port each is routed through (`FlowRedirector`: the node's own configuration). Where
there is none (no redirector, or no alternate for any of them) it slows the low class as `rate_limit` {"share"}
would, and the ack says so. It is leased like a limit; `resume` (or the lease's end) ends both.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

from clocktower.actuators import metrics
from clocktower.actuators.flow_redirector import FlowRedirector, RedirectError, parse_destinations, parse_source
from clocktower.actuators.hooks import Hooks
from clocktower.actuators.link_routing import LinkRouting
from clocktower.actuators.qos_leases import DEFAULT_LEASE_S, RETRY_NS, Leases, lease_ns
from clocktower.actuators.quarantine import Quarantine
from clocktower.actuators.seen_commands import SeenCommands
from clocktower.actuators.traffic_shaper import TrafficShaper
from clocktower.control.command_check import MAX_LIFETIME_NS, refusal
from clocktower.control.signing import CommandVerifier
from clocktower.control.traffic_class import PAUSED_SHARE, SHAPED, parse_share
from clocktower.runtime.rate_limit import TokenBucket
from clocktower.schemas.codec import bounded
from clocktower.schemas.control import ControlAck, ControlCommand

log = logging.getLogger(__name__)
REFUSAL_LINES_PER_S = 20      # refused commands logged one by one, per second (after a burst of REFUSAL_LINES_BURST)
REFUSAL_LINES_BURST = 200
DETAIL_LIMIT = 4000
LINK_ACTIONS = ("failover", "restore", "quarantine", "release")
HOOK_ACTIONS = ("drain", "spare", "undrain")
QOS_ACTIONS = ("rate_limit", "pause", "resume", "redirect")
LEFTOVER = "(before this actuator started)"   # the holder of a cap found in place at start


class Refused(Exception):
    """Applying is not allowed (the node is unchanged); the message is the ack's detail."""


def _iso(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, UTC).isoformat(timespec="milliseconds")


class Actuator:
    """Applies `node`'s commands; see the module doc. Thread-safe (one command at a time)."""

    def __init__(self, node: str, verifier: CommandVerifier, routing: LinkRouting, seen: SeenCommands,
                 quarantine: Quarantine, hooks: Hooks, clock: Callable[[], int] = time.time_ns, *,
                 backups: Callable[[str], str], shaper: TrafficShaper | None = None,
                 qos_lease_s: float = DEFAULT_LEASE_S, lease_clock: Callable[[], int] = time.monotonic_ns,
                 redirector: FlowRedirector | None = None) -> None:
        """`backups(link)`: the backup port this node has for `link` ("" if none), from its own configuration or
        discovery (the agent's port topology), never from a report or a command. `shaper`: the node's traffic
        shaper for `rate_limit`, `pause` and `resume` (None: those are refused, saying how to configure one);
        `qos_lease_s`: how long a limit holds without renewal when its command names no `lease_s`, on `lease_clock`
        (monotonic: a step of the wall clock must not lift limits early or hold them longer)."""
        self.node = node
        self.shaper = shaper
        self.redirector = redirector
        self._fallback: set[str] = set()   # holders whose cap stands in for a redirect that found no path
        self.qos_lease_s = qos_lease_s
        self.leases = Leases()
        self.lease_clock = lease_clock
        if shaper is not None and shaper.leftover():   # a cap an earlier actuator left: held one lease, then lifted
            self.leases.grant(LEFTOVER, lease_clock(), round(qos_lease_s * 1e9))
            log.warning("the low class is shaped already (left by an earlier actuator): lifted in %g s unless a "
                        "limit is renewed", qos_lease_s)
        self.leases_expired = 0   # limits lifted because no renewal came in time
        self.backups = backups
        self.verifier = verifier
        self.routing = routing
        self.seen = seen
        self.quarantine = quarantine
        self.hooks = hooks
        self.clock = clock
        self._lock = threading.Lock()
        # A flood of forged commands must not become a flood of log lines (one WARNING each filled the log):
        # unsigned and badly signed ones are logged at most REFUSAL_LINES_PER_S, the rest counted. Every other
        # refusal (expired, replayed, another node's) is a signed command's: always logged.
        self._refusal_lines = TokenBucket(REFUSAL_LINES_PER_S, REFUSAL_LINES_BURST, clock())
        self.refusals_not_logged = 0

    def handle(self, cmd: ControlCommand) -> ControlAck:
        """The ack for `cmd`, after applying it if it may be applied. Never raises."""
        with self._lock:
            try:
                return self._handle(cmd)
            except Exception as exc:  # noqa: BLE001 - a bug must not stop the actuator: the ack says it
                log.exception("command %s could not be handled", cmd.command_id)
                return self._ack(cmd, "failed", f"actuator error: {type(exc).__name__}: {exc}")

    def close(self) -> None:
        """Close the on-disk memories (the routing and hooks are the caller's)."""
        self.seen.close()
        self.quarantine.close()

    def refuse(self, command_id: str, reason: str, action: str = "", target: str = "") -> ControlAck:
        """A refused ack for a command that could not even be read (a malformed record naming `command_id`)."""
        metrics.COMMANDS.labels(action if action in LINK_ACTIONS + HOOK_ACTIONS + QOS_ACTIONS else "", "refused").inc()
        return ControlAck(node=self.node, ts_ns=self.clock(), command_id=bounded(command_id, 256) or "unknown",
                          status="refused", detail=bounded(reason, DETAIL_LIMIT),
                          action=action if action in LINK_ACTIONS + HOOK_ACTIONS + QOS_ACTIONS  # type: ignore[arg-type]
                          else "",
                          target=bounded(target, 256))

    def _handle(self, cmd: ControlCommand) -> ControlAck:
        now = self.clock()
        reason = refusal(cmd, node=self.node, now_ns=now, verifier=self.verifier)
        if reason is not None:
            return self._ack(cmd, "refused", reason)
        try:
            # Remembered as long as any copy of it may be valid: the streams sign a redelivered command again with
            # a later expiry (dated from when it is issued), never later than its event time + MAX_LIFETIME_NS.
            prev = self.seen.claim(cmd.command_id, cmd.ts_ns + MAX_LIFETIME_NS)
        except OSError as exc:   # no replay protection without the record: do not apply
            return self._ack(cmd, "failed", f"cannot record the command id ({exc}); not applied")
        if prev is not None:
            return self._ack(cmd, "refused", f"replayed (first handled at {_iso(prev.first_ns)}, status {prev.status})")
        started = time.perf_counter_ns()
        try:
            status, detail = "applied", self._apply(cmd)
        except Refused as exc:
            status, detail = "refused", str(exc)
        except Exception as exc:  # noqa: BLE001 - RoutingError, HookError or anything else: the ack says why
            status, detail = "failed", str(exc) or type(exc).__name__
        apply_ns = time.perf_counter_ns() - started if status != "refused" else 0
        try:
            self.seen.finish(cmd.command_id, status)
        except OSError as exc:
            log.error("outcome of %s not recorded (%s): a redelivery applies it again", cmd.command_id, exc)
        return self._ack(cmd, status, detail, apply_ns)  # type: ignore[arg-type]

    def _ack(self, cmd: ControlCommand, status: str, detail: str, apply_ns: int = 0) -> ControlAck:
        forged = status == "refused" and detail.startswith(("unsigned", "bad signature"))
        if status != "applied" and (not forged or self._refusal_lines.take(self.clock())):
            log.warning("%s %s %s: %s %s", status, cmd.action, cmd.target, cmd.command_id, detail)
        elif forged:
            self.refusals_not_logged += 1
            n = self.refusals_not_logged
            if n & (n - 1) == 0:   # 1, 2, 4, ...: the flood is said, not each command
                log.warning("%d refused commands not logged one by one: more than %g a second (a flood of bad "
                            "commands?); the last: %s", n, REFUSAL_LINES_PER_S, bounded(detail, 200))
        ack = ControlAck(node=self.node, ts_ns=self.clock(), command_id=cmd.command_id, status=status,  # type: ignore[arg-type]
                         detail=bounded(detail, DETAIL_LIMIT), action=cmd.action, target=cmd.target,
                         apply_ns=apply_ns)
        metrics.COMMANDS.labels(cmd.action, status).inc()
        if status != "refused":   # applied or failed: a refused one may be forged (its time is whatever its sender
            # wrote) or a replay hours later, neither a command-to-ack time to report
            metrics.COMMAND_TO_ACK.labels(cmd.action).observe(max(ack.ts_ns - cmd.ts_ns, 0) / 1e9)
        if apply_ns:
            metrics.APPLY.labels(cmd.action).observe(apply_ns / 1e9)
        return ack

    # -- the actions -------------------------------------------------------------------------------------

    def _apply(self, cmd: ControlCommand) -> str:
        if cmd.action in LINK_ACTIONS:
            if not cmd.target:
                raise Refused("no link named (empty target)")
            return getattr(self, f"_{cmd.action}")(cmd)
        if cmd.action in QOS_ACTIONS:
            return self._qos(cmd)
        if cmd.action in HOOK_ACTIONS:
            if not self.hooks.has(cmd.action):
                raise Refused(f"no {cmd.action} hook configured on this node "
                              f"(CLOCKTOWER_ACTUATOR_{cmd.action.upper()}_HOOK)")
            return self.hooks.run(cmd) or f"{cmd.action} hook ran"
        raise Refused(f"{cmd.action} is not supported by this actuator")

    def _qos(self, cmd: ControlCommand) -> str:
        """`rate_limit` {"share"}, `pause`, `redirect` {"dst", "share"} and `resume` of the low traffic class
        (control/traffic_class.py): the only class the pipeline slows or moves. The shaped links, their rates and
        the alternate ports are this node's configuration."""
        if self.shaper is None and (cmd.action not in ("redirect", "resume") or self.redirector is None):
            raise Refused("no traffic shaper on this node (CLOCKTOWER_ACTUATOR_QOS_LINKS=LINK=MBITS,...)")
        if cmd.target != SHAPED:
            raise Refused(f"only the {SHAPED!r} traffic class is shaped (the command names {cmd.target!r})")
        holder = cmd.params.get("toward", "") or cmd.incident_id   # the congested link the limit is held for
        if cmd.action == "resume":
            done = self._lift(holder)   # one that fails keeps its lease: the expiry lifts it again
            self.leases.drop(holder)
            return done
        try:
            lease = lease_ns(cmd.params.get("lease_s"), self.qos_lease_s)
            share = PAUSED_SHARE if cmd.action == "pause" else parse_share(cmd.params.get("share", ""))
            destinations = parse_destinations(cmd.params.get("dst", "")) if cmd.action == "redirect" else []
            source = parse_source(cmd.params["src"]) if cmd.params.get("src") else None
        except ValueError as exc:
            raise Refused(str(exc)) from None
        self.leases.grant(holder, self.lease_clock(), lease)   # first: a limit applied to some links, then failing,
        held = f" (held {lease / 1e9:g} s unless renewed)"     # is lifted at its expiry all the same
        if not destinations:
            self._fallback.discard(holder)                      # a limit of its own, not a redirect's stand-in
            return self.shaper.limit(share, holder) + held     # type: ignore[union-attr] - checked above
        why = "no alternate path configured (CLOCKTOWER_ACTUATOR_REDIRECT_PATHS)"
        if self.redirector is not None:
            try:
                done = self.redirector.redirect(destinations, holder, source)
            except RedirectError as exc:   # no path (or the kernel refused): slow the low class instead
                why = str(exc)
            else:
                if holder in self._fallback and self.shaper is not None:   # a path again: the stand-in cap goes
                    self._fallback.discard(holder)
                    done += f"; {self.shaper.resume(holder)}"
                return done + held
        if self.shaper is None:   # nothing to hold: what the holder held before ends with its lease, now
            self._lift(holder)
            self.leases.drop(holder)
            raise Refused(f"cannot redirect: {why}; and no traffic shaper to slow the low class instead")
        self._fallback.add(holder)
        return f"{why}: {self.shaper.limit(share, holder)} instead{held}"

    def _lift(self, holder: str) -> str:
        """End `holder`'s limit and redirect."""
        self._fallback.discard(holder)
        done = []
        if self.redirector is not None:
            done.append(self.redirector.release(holder))
        if self.shaper is not None:
            done.append(self.shaper.resume(holder))
        return "; ".join(done)

    def expire_leases(self) -> list[str]:
        """Lift the limits and redirects whose lease ran out with no renewal; the holders lifted. Never raises: a
        lift that fails is logged and tried again RETRY_NS later."""
        with self._lock:
            if self.shaper is None and self.redirector is None:
                return []
            now = self.lease_clock()
            lifted = []
            for holder in self.leases.expired(now):
                try:
                    done = self._lift(holder)
                except Exception as exc:  # noqa: BLE001 - tried again, never stops the consumer
                    log.error("QoS limit held for %s: its lease ran out but lifting it failed (%s); trying again in "
                              "%g s", holder, exc, RETRY_NS / 1e9)
                    self.leases.grant(holder, now, RETRY_NS)
                    continue
                self.leases_expired += 1
                lifted.append(holder)
                log.warning("QoS limit held for %s lifted: no renewal came within its lease (%s)", holder, done)
            return lifted

    def _backup(self, cmd: ControlCommand, key: str) -> str:
        backup = cmd.params.get(key, "")
        if not backup:
            raise Refused(f"no backup port (params {key!r} is empty)")
        if backup == cmd.target:
            raise Refused(f"{cmd.target} cannot be its own backup")
        own = self.backups(cmd.target)
        if not own:
            raise Refused(f"this node knows no backup port for {cmd.target} (configure one: "
                          f"CLOCKTOWER_AGENT_LINK_BACKUPS={cmd.target}=PORT, or give it a backup route)")
        if backup != own:
            raise Refused(f"the command names {backup!r} as {cmd.target}'s backup port, but this node's is {own!r}")
        return backup

    def _failover(self, cmd: ControlCommand) -> str:
        return self.routing.fail_over(cmd.target, self._backup(cmd, "to"))

    def _restore(self, cmd: ControlCommand) -> str:
        backup = self._backup(cmd, "from")
        if self.quarantine.get(cmd.target) is not None:
            raise Refused(f"{cmd.target} is quarantined: traffic stays on its backup until an operator runs "
                          f"`clocktower control release {self.node} {cmd.target}`")
        return self.routing.restore(cmd.target, backup)

    def _quarantine(self, cmd: ControlCommand) -> str:
        backup = self._backup(cmd, "to")
        moved = self.routing.fail_over(cmd.target, backup)   # idempotent: "already on ..." when it is
        self.quarantine.mark(cmd.target, backup, cmd.command_id)
        return f"{moved}; {cmd.target} quarantined until `clocktower control release {self.node} {cmd.target}`"

    def _release(self, cmd: ControlCommand) -> str:
        mark = self.quarantine.get(cmd.target)
        if cmd.params.get("from"):
            backup = self._backup(cmd, "from")
        elif mark is not None:
            backup = mark.backup
        else:
            raise Refused(f"{cmd.target} is not quarantined and the release names no backup port")
        restored = self.routing.restore(cmd.target, backup)   # first: a failed restore keeps the mark
        self.quarantine.unmark(cmd.target)
        return f"released {cmd.target}; {restored}"
