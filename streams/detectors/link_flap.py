"""Link health: fail a link over when it is down or flapping, restore it once stable, quarantine a chronic flapper.

The pipeline's side of the control loop (the agent's local watchdog is the fast path; this one also covers a
node without it, and decides every restore). Time is the event time of the node's own reports. Rules:

- **One physical port is one link.** A report whose `link` is set and differs from its `interface` is an alias
  (a RoCE RDMA port `mlx5_0/1` over its netdev `eth0`): it is counted in `aliases` and changes nothing; the
  netdev's own reports count. So one flap opens one incident and no command ever names an RDMA port.
- **Down.** A link seen up, then down (carrier lost or not up) for `watchdog_ns` or more gets a `failover`
  {"from": link, "to": backup} and a `link_down` incident, flap or not. The deadline is a timer entry in the
  state store, so `tick` fires it when the partition's event time passes it even if the node sends nothing
  more; the link's next report fires it otherwise (with 0, the down report does). Both give the same ids.
  A link first seen down was never seen working (an uncabled port): it is watched from its first up.
- **Blip.** A link that goes down and comes back before the watchdog (a 30 ms loss of carrier), and then stays up
  `BLIP_SETTLE_NS` (1 s; else it was the start of a flap burst, which is the incident; with an incident already
  open on the link, it must have been stable that long before the blip too: not the tail of its burst), is
  recorded as a `link_blip` incident, opened and resolved at once (it is over when seen), with its duration and
  the link's downs in the last hour as evidence: no command, but repeated blips predict a failing optic or cable,
  so from the third in an hour it is a warning that says so. A down and up that fell between two reports (the
  carrier counter moved by two, the link up both times) is one too, of unknown length. The settle is a timer
  entry ["node", "link", "blip"], fired by `tick` like the watchdog.
- **Flap burst.** `min_transitions` carrier changes within `window_ns` is one `link_flap` incident, with a
  failover; if the link already has an incident open (a `link_down`), that one gets an update instead.
- **Restore.** An incident whose link has been up with no carrier change for `stable_ns` resolves, with a
  `restore` {"from": backup, "to": link} if it failed over. At most one failover and one restore per incident.
  Like the watchdog, the deadline (newest change + `stable_ns`) is a timer entry that `tick` fires, so a link
  whose agent reports only on change (CLOCKTOWER_AGENT_LINK_REPORT_S=0) or seldom is restored on time; a
  carrier change moves it. Whichever fires it (tick or the link's next report), the restore is as of the
  deadline, so the ids are the same.
- **Quarantine.** More than `quarantine_flaps` downs in a sliding hour gives a `quarantine` {"from": link,
  "to": backup} and a critical `link_quarantine` incident asking a human to run `clocktower control release
  NODE LINK` once the link is fixed. While the link is marked, the detector orders no restore (the actuator
  holds traffic on the backup until released; a release restores), but a link that goes down still gets its
  failover: a release may not have been seen yet, so a released link must not be left on a dead primary, and on
  a still quarantined node the failover is a no-op ("already on eth1"). A release is seen in the node's reports
  (below): the node reported the quarantine held, then not. Otherwise (no actuator's view, or a node that never
  held it: no backup, the command refused or expired) the mark clears when the hourly count is back under the
  limit and no incident is open (hysteresis: set above N, cleared below N), and the `link_quarantine` incident
  stays open; while the node reports the link quarantined, the mark stays.
- **What the node did by itself.** A report carries what the node's actuator knows (`on_backup`, `quarantined`;
  null without an actuator, and then nothing here changes). A link on its backup that this detector did not fail
  over (the agent's own watchdog did: its T_watchdog is shorter than this one's, or the down was too short to
  be seen here) gets a `link_down` incident that says so, and is restored after `stable_ns` like any other. A
  quarantined link the node reported held and now reports not quarantined was released by an operator:
  the mark and the hourly count clear,
  and the `link_quarantine` incident resolves. Reports sent before this detector's own restore or quarantine
  was applied still tell the old state, so each view is trusted only from `NODE_VIEW_GRACE_NS` after that
  command. A link still reported on its backup `max(grace, stable_ns)` after our restore gets it again (a
  retry: the restore was lost or failed), with that wait doubling per retry up to 64 times, until the node
  reports the link back on its primary.
- **No backup.** A link whose report names no `backup` never gets a command (no empty target): its incident
  says "no backup port configured for LINK: no failover".

Every incident row lists the ids of the commands its incident caused so far (`command_ids`, command_id_of).

Keyed by node (the records' own key); one state entry per link, ["node", "link"], which expires `ttl_ns` of
event time after the link's newest report (default 24 h; an open incident then is never resolved, and is
counted in `expired_open`), plus short-lived timer entries: ["node", "link", "watchdog"] while the link is
down, ["node", "link", "restore"] while an incident's link is up (a fired timer also counts in the store's
`expired`), and ["fired", report key, ts, i] for what a tick fired (fired_log.py; also counted in `expired`).
A redelivered report is not applied again and re-emits what it emitted (delivery_log.py); those are counted
in `redelivered`. Limits: the
watchdog compares the node's down time with the partition's event time, i.e. with the other nodes' clocks
(a node whose clock runs behind fails over late by its offset, unless its own next report comes first; the
restore timer likewise). What `tick` fires is logged under the batch's newest applied report (of any link of
the partition; in entries of its own, fired_log.py), which a worker killed before its commit replays, so it is
sent again; in the one case with no
report applied in the batch (all redelivered, or aliases) it is not logged, and a worker killed between writing
its state and publishing loses it (a lost restore is ordered again once the node reports the link still on its
backup; a lost failover was the agent's watchdog's to do first).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import orjson

from clocktower.control.intent import CommandIntent, command_id_of
from clocktower.schemas.analytics import Incident, IncidentKind
from clocktower.schemas.event import Event
from clocktower.schemas.ids import bounded_name, stable_id
from clocktower.schemas.telemetry import LinkState
from clocktower.streams.detectors import fired_log
from clocktower.streams.detectors.delivery_log import DeliveryLog, Emitted, decode_entry, encode_entry
from clocktower.streams.detectors.replaying_detector import ReplayingDetector
from clocktower.streams.processor import Output, compound_key

if TYPE_CHECKING:
    from clocktower.streams.processor_context import ProcessorContext

DEFAULT_PORT_TTL_NS = 24 * 3600 * 10**9
HOUR_NS = 3600 * 10**9
BLIP_SETTLE_NS = 10**9          # a blip is recorded once its link has stayed up this long (else: a flap burst)
MAX_CHANGES_PER_REPORT = 1000   # a counter jump larger than this (a reset misread) counts as this many
# A node's report of its actuator's state is trusted from this long after our own restore or quarantine: reports
# made before the node applied it (the command's trip through Kafka, or an actuator that was briefly away) say
# the old state. Event time, the node's own clock for both.
NODE_VIEW_GRACE_NS = 5 * 10**9
MAX_RETRY_DOUBLINGS = 6         # a restore the node keeps not applying is ordered again at most every ~11 min


@dataclass
class Port:
    up: bool
    carrier_changes: int
    backup: str = ""
    changes: list[list[int]] = field(default_factory=list)   # [ts_ns, count] of carrier changes in the window
    downs: list[list[int]] = field(default_factory=list)     # [ts_ns, count] of down transitions in the hour
    last_change_ns: int = 0
    down_since: int | None = None        # when the link was seen going down; None while up or never seen up
    incident_id: str | None = None
    incident_kind: str = ""
    opened_ns: int = 0
    flapped: bool = False                # this incident has reported its flap burst
    failed_over_to: str = ""             # the backup this incident failed over to ("" = not failed over)
    command_ids: list[str] = field(default_factory=list)    # this incident's commands
    quarantined: bool = False
    quarantine_id: str = ""              # the open link_quarantine incident ("" = none, or not ours to resolve)
    quarantined_ns: int = 0              # when the mark was set
    node_held: bool = False              # the node has reported this quarantine held (only then can it be released)
    restored_ns: int = 0                 # when our newest restore was ordered
    restore_retries: int = 0             # restores ordered again since the node last reported the link back on it
    blip: list[int] = field(default_factory=list)   # [down since (-1: unseen), back up] of a blip settling
    log: DeliveryLog = field(default_factory=DeliveryLog)

    @property
    def recent_changes(self) -> int:
        return sum(n for _, n in self.changes)

    @property
    def hourly_downs(self) -> int:
        return sum(n for _, n in self.downs)


@dataclass
class Timer:
    """A deadline in the store (its expiry): the watchdog of a link down since `since`, or the restore of a link
    whose carrier has not changed since `since` (its newest change, up)."""

    node: str
    link: str
    since: int
    kind: str = "watchdog"     # or "restore", or "blip" (since: when the link came back up)


class LinkFlapDetector(ReplayingDetector):
    """Returns incidents and unsigned command intents; the streams' edge signs the intents."""

    name: ClassVar[str] = "link_flap"
    consumes: ClassVar[tuple[type[Event], ...]] = (LinkState,)
    key_by: ClassVar[str] = "node"
    entry: ClassVar[type] = Port

    def __init__(self, *, window_ns: int = 10 * 10**9, min_transitions: int = 3, stable_ns: int = 10 * 10**9,
                 watchdog_ns: int = 50 * 10**6, quarantine_flaps: int = 8,
                 ttl_ns: int = DEFAULT_PORT_TTL_NS) -> None:
        super().__init__(ttl_ns)
        self.window_ns = window_ns
        self.min_transitions = min_transitions
        self.stable_ns = stable_ns
        self.watchdog_ns = watchdog_ns
        self.quarantine_flaps = quarantine_flaps
        self.aliases = 0      # reports of an RDMA port about its netdev's link: not counted
        self.unwatched = 0    # reports of a new port that the state cap kept out (state_store.py)
        self._applied: tuple[str, int] | None = None   # the batch's newest applied report: (key, ts_ns)

    @classmethod
    def from_context(cls, ctx: ProcessorContext) -> LinkFlapDetector:
        return cls(stable_ns=ctx.link_stable_ns, watchdog_ns=ctx.link_watchdog_ns,
                   quarantine_flaps=ctx.link_quarantine_flaps)

    def is_open(self, entry: Port | fired_log.FiredChunk) -> bool:
        return isinstance(entry, Port) and entry.incident_id is not None

    def counters(self) -> dict[str, int]:
        return {**super().counters(), "aliases": self.aliases, "unwatched": self.unwatched}

    def encode_state(self, value: Any) -> bytes:
        if isinstance(value, Timer):
            return orjson.dumps({"timer": [value.node, value.link, value.since, value.kind]})
        if isinstance(value, fired_log.FiredChunk):
            return fired_log.encode(value)
        return encode_entry(value)

    def decode_state(self, data: bytes) -> Any:
        if data.startswith(b'{"timer"'):
            return Timer(*orjson.loads(data)["timer"])
        if data.startswith(fired_log.PREFIX):
            return fired_log.decode(data)
        return decode_entry(Port, data)

    # --- events -----------------------------------------------------------------------------------------

    def process(self, state: Any, event: Event) -> list[Output]:
        assert isinstance(event, LinkState)
        if event.link and event.link != event.interface:
            self.aliases += 1
            return []
        key = compound_key(event.node, event.interface)
        port: Port | None = state.get(key)
        out: Emitted = []
        if port is None and not state.admits(key):
            self.unwatched += 1        # its partition holds CLOCKTOWER_STREAMS_MAX_ENTRIES: a new port is not watched
            return []
        if port is None:
            port = Port(up=event.up, carrier_changes=event.carrier_changes, backup=event.backup,
                        last_change_ns=event.ts_ns)
        elif port.log.was_applied(event.ts_ns, state.delivery):
            self.redelivered += 1
            if state.delivery is not None and not port.log.replayed(event.ts_ns, state.delivery):
                return []      # a copy, or stale: nothing to publish again (delivery_log.py)
            return [*port.log.outputs_of(event.ts_ns, state.delivery), *fired_log.fired_with(state, key, event.ts_ns)]
        else:
            out = self._apply(state, port, event)
        port.log.applied(event.ts_ns, out, state.delivery)
        state.put(key, port, port.log.newest + self.state_ttl_ns)
        self._applied = (key, event.ts_ns)
        return list(out)

    def tick(self, state: Any, now_ns: int) -> list[Output]:
        """Expire old entries; fire the watchdog or restore of every link whose deadline the partition's time
        passed (so neither waits for the link's own next report, which an agent reporting only on change may
        never send)."""
        out: Emitted = []
        expired = []
        for key, value in state.expire(now_ns):
            if isinstance(value, Timer):
                out += self._fire(state, value, now_ns)
            else:
                expired.append((key, value))
        self._log_fired(state, out, now_ns)
        return [*out, *self.on_expired(expired)]

    def _log_fired(self, state: Any, fired: Emitted, now_ns: int) -> None:
        """Log what the timers fired under the batch's newest applied report, which is published with them: a
        worker killed before its commit replays that report, and the replay re-emits these as well."""
        applied, self._applied = self._applied, None
        if fired and applied is not None:      # else fired by time alone (no report applied): not replayable
            fired_log.log_fired(state, *applied, fired, now_ns)

    def _fire(self, state: Any, timer: Timer, now_ns: int) -> Emitted:
        key = compound_key(timer.node, timer.link)
        port: Port | None = state.get(key)
        if port is None:
            return []
        if timer.kind == "restore":
            if not self._restore_due(port) or port.last_change_ns != timer.since:
                return []
            out = self._resolve(timer.node, timer.link, port, now_ns)
        elif timer.kind == "blip":
            if not port.blip or port.blip[1] != timer.since:
                return []
            began = port.blip[0] if port.blip[0] >= 0 else timer.since   # (-1: the down fell between two reports)
            about_it = port.incident_id is not None and port.opened_ns >= began   # (the node's own failover on it)
            if port.last_change_ns != timer.since or not port.up or about_it:
                port.blip = []   # more changes came (a flap burst: its own incident), or an incident opened on it
                state.put(key, port, port.log.newest + self.state_ttl_ns)
                return []
            out = self._blip(timer.node, timer.link, port)
        elif port.up or port.down_since != timer.since:
            return []
        else:
            out = self._watchdog(timer.node, timer.link, port)
        if out:
            state.put(key, port, port.log.newest + self.state_ttl_ns)
        return out

    def _restore_due(self, port: Port, now_ns: int | None = None) -> bool:
        """An open incident whose link is up and (at `now_ns`, if given) stable for `stable_ns`."""
        stable = now_ns is None or now_ns - port.last_change_ns >= self.stable_ns
        return port.incident_id is not None and port.up and stable

    def _apply(self, state: Any, port: Port, ev: LinkState) -> Emitted:
        node, link, ts = ev.node, ev.interface, ev.ts_ns
        out: Emitted = []
        had_incident = port.incident_id is not None
        if port.down_since is not None and ts - port.down_since >= self.watchdog_ns:
            out += self._watchdog(node, link, port)      # it was down that long before this report
        if self._restore_due(port, ts):
            out += self._resolve(node, link, port, ts)   # it was up and stable that long before this report
        was_up = port.up
        # Count changes the counter saw even between two reports; a state change
        # with a reset counter (agent restart) still counts as one.
        counted = ev.carrier_changes - port.carrier_changes if ev.carrier_changes >= port.carrier_changes else 0
        delta = min(max(counted, 1 if ev.up != was_up else 0), MAX_CHANGES_PER_REPORT)
        # Ethernet counts both edges; an InfiniBand port's counter is link_downed (downs only).
        downs = (delta + was_up) // 2 if ev.kind == "ethernet" else max(counted, int(was_up and not ev.up))
        port.up, port.carrier_changes, port.backup = ev.up, ev.carrier_changes, ev.backup
        if delta:
            port.changes.append([ts, delta])
            port.last_change_ns = ts
        if downs:
            port.downs.append([ts, min(downs, MAX_CHANGES_PER_REPORT)])
        port.changes = [c for c in port.changes if c[0] >= ts - self.window_ns]
        # [ts, downs] entries of the last hour; N+1 of them (each at least one down) tell "more than N" and "under N"
        port.downs = [d for d in port.downs if d[0] > ts - HOUR_NS][-(self.quarantine_flaps + 1):]
        self._track_blip(state, node, link, port, ts, ev.up, downs, was_up)
        out += self._track_down(state, node, link, port, ts, went_down=not ev.up and delta > 0)
        out += self._node_view(node, link, port, ev)
        if self._restore_due(port, ts):
            out += self._resolve(node, link, port, ts)   # stable_ns 0
        if port.recent_changes >= self.min_transitions and not port.flapped:
            out += self._flap(node, link, port, ts)
        if port.hourly_downs > self.quarantine_flaps and not port.quarantined:
            out += self._quarantine(node, link, port, ts)
        elif (port.quarantined and port.incident_id is None and port.hourly_downs < self.quarantine_flaps
              and not ev.quarantined):
            port.quarantined = port.node_held = False
        self._track_restore(state, node, link, port, had_incident)
        return out

    def _track_restore(self, state: Any, node: str, link: str, port: Port, had_incident: bool) -> None:
        """Keep the restore timer at the newest change + `stable_ns` while an open incident's link is up; a carrier
        change moves it (a down, or the incident's end, removes it)."""
        key = compound_key(node, link, "restore")
        if self._restore_due(port):
            timer = state.get(key)
            if not isinstance(timer, Timer) or timer.since != port.last_change_ns:
                state.put(key, Timer(node, link, port.last_change_ns, "restore"), port.last_change_ns + self.stable_ns,
                          capped=False)   # a kept port's timer: never refused (state_store.py)
        elif had_incident:
            state.delete(key)

    def _track_blip(self, state: Any, node: str, link: str, port: Port, ts: int, up: bool, downs: int,
                    was_up: bool) -> None:
        """A down shorter than the watchdog, seen come back up (or only in the counter), on a link not quarantined:
        its settle timer starts (module doc). With an incident open, only an isolated one (the link stable for
        `BLIP_SETTLE_NS` before it too): a short down inside a flap burst is the burst's. Called before the down is
        cleared, after this report's change is counted."""
        if not up or port.quarantined:
            return
        if port.down_since is not None and ts - port.down_since < self.watchdog_ns:
            blip = [port.down_since, ts]
        elif port.down_since is None and was_up and downs:
            blip = [-1, ts]
        else:
            return
        if port.incident_id is not None:
            start = ts if blip[0] < 0 else blip[0]
            before = [c for c, _ in port.changes if c < start]
            if before and start - before[-1] < BLIP_SETTLE_NS:
                return
        port.blip = blip
        state.put(compound_key(node, link, "blip"), Timer(node, link, ts, "blip"), ts + BLIP_SETTLE_NS, capped=False)

    def _blip(self, node: str, link: str, port: Port) -> Emitted:
        """The settled blip: one `link_blip` incident, opened and resolved, as of the end of its settle."""
        since, back = port.blip
        port.blip = []
        ts = back + BLIP_SETTLE_NS
        down_ms = (back - since) / 1e6 if since >= 0 else None
        length = f"{down_ms:.0f} ms" if down_ms is not None else "an unknown time (between two reports)"
        hourly = port.hourly_downs
        why = f"; {hourly} downs in the last hour: repeated blips predict a failing optic or cable" * (hourly >= 3)
        detail = f"carrier lost for {length}, back before the {self.watchdog_ns / 1e6:g} ms watchdog: no failover{why}"
        if port.incident_id is not None:   # its restore waits for the link to be stable again
            detail += f"; {port.incident_kind} {port.incident_id} still open, its restore waits for a stable link"
        evidence = orjson.dumps({"down_ms": down_ms, "back_up_ns": back, "downs_last_hour": hourly,
                                 "watchdog_ms": self.watchdog_ns / 1e6, "open_incident": port.incident_id}).decode()
        incident_id = stable_id("link_blip", node, link, back)
        return [Incident(node=node, ts_ns=ts, incident_id=incident_id, kind="link_blip", state=state,
                         severity=("warning" if hourly >= 3 else "info") if state == "open" else "info",
                         target=bounded_name(f"{node}/{link}"), opened_ns=ts, detail=detail, evidence=evidence,
                         command_ids=[])
                for state in ("open", "resolve")]

    def _track_down(self, state: Any, node: str, link: str, port: Port, ts: int, went_down: bool) -> Emitted:
        timer_key = compound_key(node, link, "watchdog")
        if port.up:
            if port.down_since is not None:
                port.down_since = None
                state.delete(timer_key)
            return []
        if not went_down:
            return []
        port.down_since = ts
        if self.watchdog_ns == 0:
            return self._watchdog(node, link, port)
        state.put(timer_key, Timer(node, link, ts), ts + self.watchdog_ns, capped=False)
        return []

    def _node_view(self, node: str, link: str, port: Port, ev: LinkState) -> Emitted:
        """Catch up with what the node's actuator did that this detector did not order (see the module doc)."""
        ts, out = ev.ts_ns, []
        trusted = ts >= port.quarantined_ns + NODE_VIEW_GRACE_NS
        if ev.quarantined is False and port.quarantined and port.node_held and trusted:
            out += self._released(node, link, port, ts)
        elif ev.quarantined and not port.quarantined:
            port.quarantined, port.quarantined_ns = True, ts      # held by the node: no restore from here
        if ev.quarantined and port.quarantined:
            port.node_held = True
        if ev.on_backup is False:
            port.restore_retries = 0
        retry_after = max(NODE_VIEW_GRACE_NS, self.stable_ns) << min(port.restore_retries, MAX_RETRY_DOUBLINGS)
        if (ev.on_backup and port.backup and not port.failed_over_to and not port.quarantined
                and (not port.restored_ns or ts >= port.restored_ns + retry_after)):
            detail = (f"the node's watchdog moved {link}'s traffic to {port.backup}; restore after "
                      f"{self.stable_ns / 1e9:g} s of stable carrier")
            if port.restored_ns:
                port.restore_retries += 1
                detail = (f"still on {port.backup} {(ts - port.restored_ns) / 1e9:.0f} s after the restore "
                          f"was ordered: ordering it again")
            state = "update"
            if port.incident_id is None:
                self._open(node, link, port, "link_down", ts)
                state = "open"
            port.failed_over_to = port.backup
            out.append(self._row(node, link, port, state, "critical", detail, ts))
        return out

    def _released(self, node: str, link: str, port: Port, ts: int) -> Emitted:
        """An operator released the link (`clocktower control release`): the hourly count starts again."""
        port.quarantined, port.downs, port.node_held = False, [], False
        out: Emitted = []
        if port.quarantine_id:
            out.append(Incident(node=node, ts_ns=ts, incident_id=port.quarantine_id, kind="link_quarantine",
                                state="resolve", severity="info", target=bounded_name(f"{node}/{link}"),
                                opened_ns=port.quarantined_ns, command_ids=[],
                                detail="released: the node no longer holds the link on its backup"))
        port.quarantine_id = ""
        return out

    # --- decisions --------------------------------------------------------------------------------------

    def _watchdog(self, node: str, link: str, port: Port) -> Emitted:
        """The link has been down since `down_since` for the watchdog's time: make sure it failed over."""
        assert port.down_since is not None
        at = port.down_since + self.watchdog_ns
        detail = f"carrier lost for {self.watchdog_ns / 1e6:g} ms or more"
        if port.incident_id is None:
            self._open(node, link, port, "link_down", at)
            cmds, note = self._failover(node, link, port, at)
            return [self._row(node, link, port, "open", "critical", detail + note, at), *cmds]
        cmds, note = self._failover(node, link, port, at)
        if not cmds:
            return []
        return [self._row(node, link, port, "update", "critical", detail + note, at), *cmds]

    def _flap(self, node: str, link: str, port: Port, ts: int) -> Emitted:
        detail = f"{port.recent_changes} carrier changes within {self.window_ns / 1e9:g} s"
        state = "update"
        if port.incident_id is None:
            self._open(node, link, port, "link_flap", ts)
            state = "open"
        port.incident_kind, port.flapped = "link_flap", True
        cmds, note = self._failover(node, link, port, ts)
        return [self._row(node, link, port, state, "critical", detail + note, ts), *cmds]

    def _failover(self, node: str, link: str, port: Port, ts: int) -> tuple[Emitted, str]:
        """The incident's failover, once: ([intent] or [], a note for the incident's detail)."""
        if port.failed_over_to:
            return [], ""
        if not port.backup:
            return [], f"; no backup port configured for {link}: no failover"
        intent = CommandIntent(node, "failover", link, ts, port.incident_id or "", {"from": link, "to": port.backup})
        port.failed_over_to = port.backup
        port.command_ids.append(command_id_of(intent))
        # Quarantined (or released before we saw it), a failover is still
        # ordered: the actuator allows it and it is idempotent ("already on eth1"); only the restore waits.
        note = f"; quarantined: on {port.backup}, no restore until released" if port.quarantined else ""
        return [intent], note

    def _resolve(self, node: str, link: str, port: Port, now_ns: int) -> Emitted:
        """As of `stable_ns` after the newest change, whichever report or tick finds it, so the ids are the same."""
        ts = max(port.last_change_ns + self.stable_ns, port.opened_ns)   # long stable: as of the incident
        detail = f"stable for {self.stable_ns / 1e9:.1f} s"
        cmds: Emitted = []
        if port.quarantined:
            detail += f"; quarantined: no restore, traffic stays on {port.backup or 'the backup'} until released"
        elif port.failed_over_to:
            intent = CommandIntent(node, "restore", link, ts, port.incident_id or "",
                                   {"from": port.failed_over_to, "to": link})
            port.command_ids.append(command_id_of(intent))
            cmds.append(intent)
            port.restored_ns = max(ts, now_ns)   # when it was ordered (a late report orders it late): retries wait
        out: Emitted = [self._row(node, link, port, "resolve", "info", detail, ts), *cmds]
        port.incident_id, port.incident_kind, port.flapped, port.failed_over_to = None, "", False, ""
        port.command_ids = []
        port.changes.clear()
        return out

    def _quarantine(self, node: str, link: str, port: Port, ts: int) -> Emitted:
        qid = stable_id("link_quarantine", node, link, ts)
        port.quarantined, port.quarantine_id, port.quarantined_ns, port.node_held = True, qid, ts, False
        detail = (f"{port.hourly_downs} flaps within the last hour (more than {self.quarantine_flaps}): ")
        cmds: Emitted = []
        if port.backup:
            intent = CommandIntent(node, "quarantine", link, ts, qid, {"from": link, "to": port.backup})
            cmds.append(intent)
            if port.incident_id is not None:
                port.failed_over_to = port.failed_over_to or port.backup
            detail += (f"traffic held on {port.backup}, no restore; once the link is fixed, run "
                       f"`clocktower control release {node} {link}`")
        else:
            detail += f"no backup port configured for {link}: no quarantine; fix the link"
        inc = Incident(node=node, ts_ns=ts, incident_id=qid, kind="link_quarantine", state="open",
                       severity="critical", target=bounded_name(f"{node}/{link}"), opened_ns=ts, detail=detail,
                       command_ids=[command_id_of(c) for c in cmds if isinstance(c, CommandIntent)])
        return [inc, *cmds]

    def _open(self, node: str, link: str, port: Port, kind: IncidentKind, ts: int) -> None:
        port.incident_id = stable_id(kind, node, link, ts)
        port.incident_kind, port.opened_ns, port.flapped = kind, ts, False
        port.failed_over_to, port.command_ids = "", []

    def _row(self, node: str, link: str, port: Port, state: str, severity: str, detail: str, ts: int) -> Incident:
        return Incident(node=node, ts_ns=ts, incident_id=port.incident_id or "",
                        kind=port.incident_kind,  # type: ignore[arg-type]
                        state=state, severity=severity, target=bounded_name(f"{node}/{link}"),
                        opened_ns=port.opened_ns, detail=detail, command_ids=list(port.command_ids))
