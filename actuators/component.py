"""The actuator as a component of the node agent: the same check/start/stop contract as a source.

`check()` says whether the actuator can run here: the controller's public key is configured and readable, the
state dir can be made, the routing backend opens. `start(emit)` opens the on-disk memories and runs the command
consumer on its own thread, handing its acks (and dead letters) to `emit`: the agent's delivery path into the
spooling publisher. `stop()` ends the consumer (its last acks are handed over and committed) and closes them.

The demo's simulated nodes use the same parts without an agent: `open_actuator(...)` and `CommandConsumer`.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from clocktower.actuators.actuator import Actuator
from clocktower.actuators.command_consumer import CommandConsumer
from clocktower.actuators.flow_redirector import FlowRedirector
from clocktower.actuators.hooks import Hooks
from clocktower.actuators.kernel_redirector import KernelRedirector
from clocktower.actuators.kernel_shaper import KernelShaper
from clocktower.actuators.link_routing import LinkRouting
from clocktower.actuators.qos_leases import DEFAULT_LEASE_S
from clocktower.actuators.quarantine import Quarantine
from clocktower.actuators.seen_commands import SeenCommands
from clocktower.actuators.settings import ActuatorSettings
from clocktower.actuators.traffic_shaper import TrafficShaper
from clocktower.control.key_files import verifier_from_file
from clocktower.control.signing import CommandVerifier
from clocktower.runtime.broker_profile import profile_settings
from clocktower.runtime.errors import UserError
from clocktower.runtime.private_file import private_dir
from clocktower.schemas.event import Event
from clocktower.schemas.kafka_security import KafkaSecurity

log = logging.getLogger(__name__)
Emit = Callable[[list[Event]], None]
STOP_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class Availability:
    """Structurally the agent's `Availability` (ok, reason): actuators do not import producers (layers)."""

    ok: bool
    reason: str


def open_actuator(node: str, verifier: CommandVerifier, routing: LinkRouting, state_dir: Path,
                  hooks: Hooks | None = None, *, backups: Callable[[str], str],
                  shaper: TrafficShaper | None = None, qos_lease_s: float = DEFAULT_LEASE_S,
                  redirector: FlowRedirector | None = None) -> Actuator:
    """An Actuator for `node` with its memories in `state_dir` (replays refused across restarts); `backups(link)`
    is the node's own backup port of `link`, `shaper` its traffic shaper, `redirector` its flow redirect (see
    Actuator)."""
    return Actuator(node, verifier, routing, SeenCommands(state_dir), Quarantine(state_dir), hooks or Hooks({}),
                    backups=backups, shaper=shaper, qos_lease_s=qos_lease_s, redirector=redirector)


class ActuatorComponent:
    """Runs `node`'s actuator in the agent; `routing` builds the LinkRouting (kernel, or simulated in the demo)."""

    name = "actuator"

    def __init__(self, node: str, bootstrap: str, routing: Callable[[], LinkRouting],
                 settings: ActuatorSettings | None = None, security: KafkaSecurity | None = None,
                 durable_publish: Callable[[list[Event]], None] | None = None, *,
                 backups: Callable[[str], str], netns: str | None = None) -> None:
        """`backups(link)`: the node's own backup port of `link` (its port topology); a command's is checked
        against it. `durable_publish`, when given, takes the acks instead of the runner's `emit` and returns only
        once they are acknowledged or on disk (the agent's spooling publisher, flushed): the consumer commits a
        command's offset right after, so an ack still in a memory queue would be lost with the process."""
        self.node = node
        self.netns = netns   # the named network namespace whose links a KernelShaper shapes (None: this one's)
        self._durable_publish = durable_publish
        self.backups = backups
        self.bootstrap = bootstrap
        self.settings = settings or ActuatorSettings()
        self.security = security
        self.counts: Counter[str] = Counter()     # events emitted per schema (control_ack, deadletter)
        self._routing_factory = routing
        self._routing: LinkRouting | None = None
        self._verifier: CommandVerifier | None = None
        self._actuator: Actuator | None = None
        self._redirector: KernelRedirector | None = None
        self.consumer: CommandConsumer | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def check(self) -> Availability:
        try:
            path = self.settings.public_key_path()
            self._verifier = verifier_from_file(path)
            private_dir(self.settings.state_dir)
        except UserError as exc:
            return Availability(False, str(exc))
        except OSError as exc:
            return Availability(False, f"state dir {self.settings.state_dir}: {exc.strerror or exc}")
        try:
            self._routing = self._routing_factory()
        except Exception as exc:  # noqa: BLE001 - any reason the backend cannot run is the reason this is off
            return Availability(False, f"routing backend unusable: {exc}")
        hooks = ", ".join(f"{a} hook" for a in self.settings.hooks()) or "no drain/spare hooks"
        qos = (f"QoS on {', '.join(self.settings.qos_links)}" if self.settings.qos_links else
               "no QoS (CLOCKTOWER_ACTUATOR_QOS_LINKS)")
        paths = self.settings.redirect_paths
        qos += (f"; redirect {', '.join(f'{p}->{a}' for p, (a, _) in paths.items())}" if paths else
                "; no redirect (CLOCKTOWER_ACTUATOR_REDIRECT_PATHS)")
        return Availability(True, f"commands for {self.node} verified with {path}; {hooks}; {qos}")

    def start(self, emit: Emit) -> None:
        if self._verifier is None or self._routing is None:
            raise RuntimeError("start() before a successful check()")
        s = self.settings
        shaper = KernelShaper(s.qos_links, netns=self.netns) if s.qos_links else None
        if s.redirect_paths:
            redirector = KernelRedirector(s.redirect_paths, netns=self.netns, kernel_source=s.kernel_source)
            try:
                log.info("%s", redirector.start())
                self._redirector = redirector
            except Exception as exc:  # noqa: BLE001 - failover matters more: run without, and say what `redirect` does
                log.error("redirect unavailable (%s): `redirect` commands slow the low class instead", exc)
        self._actuator = open_actuator(self.node, self._verifier, self._routing, s.state_dir,
                                       Hooks(s.hooks(), s.hook_timeout_s), backups=self.backups, shaper=shaper,
                                       qos_lease_s=s.qos_lease_s, redirector=self._redirector)

        deliver = self._durable_publish or emit

        def publish(events: list[Event]) -> None:
            deliver(events)
            self.counts.update(type(e).SCHEMA for e in events)

        self.consumer = CommandConsumer(self.bootstrap, self._actuator, publish, security=self.security,
                                        idle_backoff_s=s.idle_backoff_s,
                                        consumer_extra=profile_settings(s.broker_profile).librdkafka_consumer())
        self._thread = threading.Thread(target=self.consumer.run, args=(self._stop,), name=f"actuator-{self.node}",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        try:
            if self._thread is not None:
                self._thread.join(STOP_TIMEOUT_S)
                if self._thread.is_alive():
                    log.error("the actuator's consumer did not stop within %g s", STOP_TIMEOUT_S)
                    return
            if self._actuator is not None:
                self._actuator.close()
        finally:
            if self._redirector is not None:   # even with the consumer stuck: the routing decides again
                self._redirector.close()

    def quarantined(self, link: str) -> bool | None:
        """Whether `link` is held on its backup until released; None until the actuator has started."""
        actuator = self._actuator
        return None if actuator is None else actuator.quarantine.get(link) is not None

    def stats(self) -> dict[str, object]:
        """The consumer's counts and liveness (`alive`, `loop_restarts`, `last_error`); `alive` is also false when
        its thread has ended, whatever the consumer last said."""
        if self.consumer is None:
            return {"alive": False}
        stats = self.consumer.stats()
        return {**stats, "alive": bool(stats.get("alive")) and self._thread is not None and self._thread.is_alive()}
