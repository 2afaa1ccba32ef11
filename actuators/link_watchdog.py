"""The agent's local watchdog: fail a link over by itself, without waiting for the pipeline (the fast path).

The link source calls `observe` with every LinkState, on its own thread. When a primary link with a
configured backup loses carrier (`carrier` or `up` False) and stays down for `delay_s` (T_watchdog), the
watchdog calls `routing.fail_over(link, backup)` and reports a ControlAck (origin "watchdog", action
"failover"). A link whose carrier returns within `delay_s` is left alone (hysteresis: a blip moves nothing).
It fails over once per down episode (the periodic re-reports of a down link do not repeat it) and never
restores: the pipeline decides the restore after T_stable of stable carrier, and quarantine.

One physical port can be reported by several interfaces (RoCE: the netdev `eth0` and the RDMA port
`mlx5_0/1`, whose LinkState has `link` "eth0"): the link is down while any of them last said so, and up
again only when all of them say up, so their reports arriving at different times make one episode.

`delay_s` 0 fails over at once, in the calling thread. Otherwise one scheduler thread of its own runs the
due failovers; the delay counts from the LinkState's `ts_ns` (when the change was read from netlink), not
from when `observe` ran. Whenever it sees a link come up (or first sees it up), it asks the routing to
remember the link's routes: an admin-down deletes them, and the failover must still know what to move
(a no-op while the link is still on its backup).
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from clocktower.actuators.link_routing import LinkRouting, RoutingError
from clocktower.schemas.control import ControlAck
from clocktower.schemas.telemetry import LinkState

log = logging.getLogger(__name__)


@dataclass
class _Link:
    up: bool | None = None          # all its interfaces up (None: not seen yet)
    down_ifaces: set[str] = field(default_factory=set)   # those that last reported it down
    down_ts_ns: int = 0             # ts_ns of the LinkState that saw it go down (0: up)
    episode: int = 0                # bumped on every change: a due failover of an older episode is void
    handled: bool = False           # this down episode's failover ran (or is running)
    backup: str = ""                # where its traffic goes: the configured backup, else the one its reports name


class LinkWatchdog:
    """Local failover on carrier loss; see the module doc. `backups` maps primary link -> backup port; a link
    missing there fails over to the backup its own reports name (LinkState.backup: the agent's topology)."""

    def __init__(self, node: str, routing: LinkRouting, backups: Mapping[str, str],
                 report: Callable[[ControlAck], None], delay_s: float = 0.05) -> None:
        if delay_s < 0:
            raise ValueError(f"delay_s must be >= 0, got {delay_s}")
        self.node = node
        self.routing = routing
        self.backups = {link: backup for link, backup in backups.items() if link and backup}
        self.report = report
        self.delay_s = delay_s
        self.failovers = 0             # fail_over calls that succeeded
        self.failures = 0              # ... that raised
        self.report_errors = 0
        self._links: dict[str, _Link] = {}
        self._lock = threading.Condition()
        self._due: list[tuple[float, int, str, int]] = []   # (monotonic due, seq, link, episode)
        self._seq = 0
        self._stopped = False
        self._thread: threading.Thread | None = None

    def observe(self, state: LinkState) -> None:
        """Called with every LinkState (the link source's thread); cheap unless it fails over (delay 0)."""
        link = state.link or state.interface
        backup = self.backups.get(link) or state.backup
        if not backup:
            return
        down = not state.carrier or not state.up
        run_now = False
        with self._lock:
            if self._stopped:
                return
            st = self._links.setdefault(link, _Link())
            st.backup = backup
            (st.down_ifaces.add if down else st.down_ifaces.discard)(state.interface)
            down = bool(st.down_ifaces)
            remember = not down and st.up is not True
            if down and st.up is not False:
                st.up, st.down_ts_ns, st.handled = False, state.ts_ns, False
                st.episode += 1
                if self.delay_s == 0:
                    st.handled = run_now = True
                else:
                    elapsed_s = max(0.0, (time.time_ns() - state.ts_ns) / 1e9)
                    self._schedule(time.monotonic() + max(0.0, self.delay_s - elapsed_s), link, st.episode)
            elif not down and st.up is not True:
                st.up, st.down_ts_ns = True, 0      # back before the delay: the due failover is void
                st.episode += 1
            episode, down_ts = st.episode, st.down_ts_ns
        if remember:
            self._remember(link, backup)
        if run_now:
            self._fail_over(link, backup, down_ts, episode)

    def stop(self) -> None:
        """Cancel every pending failover and end the scheduler thread (a running failover finishes)."""
        with self._lock:
            self._stopped = True
            self._due.clear()
            self._lock.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(5.0)

    # -- internals -----------------------------------------------------------------------------

    def _remember(self, link: str, backup: str) -> None:
        try:
            log.debug("watchdog: %s", self.routing.remember(link, backup))
        except RoutingError as e:
            log.warning("watchdog: cannot remember the routes of %s: %s", link, e)
        except Exception:
            log.exception("watchdog: remember(%s) failed", link)

    def _schedule(self, due: float, link: str, episode: int) -> None:
        """Caller holds the lock."""
        self._seq += 1
        heapq.heappush(self._due, (due, self._seq, link, episode))
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"clocktower-watchdog-{self.node}", daemon=True)
            self._thread.start()
        self._lock.notify_all()

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._stopped and (not self._due or self._due[0][0] > time.monotonic()):
                    self._lock.wait(None if not self._due else self._due[0][0] - time.monotonic())
                if self._stopped:
                    return
                _, _, link, episode = heapq.heappop(self._due)
                st = self._links[link]
                if st.episode != episode or st.up is not False or st.handled:
                    continue                        # carrier came back (or it was handled): nothing to do
                st.handled = True
                down_ts = st.down_ts_ns
            self._fail_over(link, st.backup, down_ts, episode)

    def _fail_over(self, link: str, backup: str, down_ts_ns: int, episode: int) -> None:
        start = time.perf_counter_ns()
        try:
            result = self.routing.fail_over(link, backup)
            status = "applied"
            self.failovers += 1
        except Exception as e:                      # RoutingError, or a backend bug: report it, keep going
            result = str(e) if isinstance(e, RoutingError) else f"{type(e).__name__}: {e}"
            status = "failed"
            self.failures += 1
            if not isinstance(e, RoutingError):
                log.exception("watchdog: fail_over(%s, %s) raised", link, backup)
        apply_ns = time.perf_counter_ns() - start
        now = time.time_ns()
        down_ms = max(0, now - down_ts_ns) / 1e6
        ack = ControlAck(node=self.node, ts_ns=now, command_id=f"watchdog:{self.node}:{link}:{down_ts_ns}",
                         status=status, action="failover", target=link, origin="watchdog", apply_ns=apply_ns,
                         detail=f"{link} down since {down_ts_ns} ({down_ms:.1f} ms, watchdog delay "
                                f"{self.delay_s * 1e3:g} ms); {result}")
        log.info("watchdog: %s %s: %s", status, link, ack.detail)
        try:
            self.report(ack)
        except Exception:
            self.report_errors += 1
            log.exception("watchdog: reporting the failover of %s failed", link)
