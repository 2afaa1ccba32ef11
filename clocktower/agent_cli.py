"""`clocktower agent`: run the node agent's sources on this node and publish what they see.

Without `--stdout` events go to Kafka through the spooling publisher (nothing lost while the broker is
away). Sources start in parallel; a table on stderr says at once which are starting, and is updated as each
one is running, off (and why) or failed. `--duration S` counts from when every source is running, off or
failed (start-up is bounded by --start-timeout), so a slow eBPF compile does not eat the run; with `--json`
the run ends with event counts per source as one JSON object on stdout.

`--actuate` also runs this node's actuator beside the sources: it applies the pipeline's signed control commands
for this node (routes with pyroute2, the operator's drain/spare hooks) and acks them through the same spooling
publisher. Producers never import actuators: this module is where the two meet.
"""

from __future__ import annotations

import argparse
import gc
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import orjson
from pyroute2 import config as pyroute2_config
from rich.console import Console

from clocktower import consoles
from clocktower.actuators.component import ActuatorComponent
from clocktower.actuators.link_routing import LinkRouting
from clocktower.actuators.link_watchdog import LinkWatchdog
from clocktower.actuators.settings import ActuatorSettings
from clocktower.agent_status_view import SourceTableView
from clocktower.config import Settings
from clocktower.durable_acks import delivered_publisher
from clocktower.producers.agent.config import ALL_SOURCES, AgentSettings
from clocktower.producers.agent.ebpf._bcc import SETUP_SCRIPT
from clocktower.producers.agent.factory import build_sources, topology_for
from clocktower.producers.agent.link_source import LinkSource
from clocktower.producers.agent.port_topology import PortTopology
from clocktower.producers.agent.runner import AgentRunner, Sink
from clocktower.producers.agent.stdout_sink import JsonLinesSink
from clocktower.producers.clock.key import ClockKeyError, generate_key_file
from clocktower.producers.spool import SpoolInUse
from clocktower.producers.spooling_publisher import SpoolingPublisher
from clocktower.runtime.bcc_build import headers_cache
from clocktower.runtime.broker_profile import profile_settings
from clocktower.runtime.errors import UserError
from clocktower.runtime.private_file import private_dir
from clocktower.schemas.event import Event
from clocktower.schemas.telemetry import LinkState

ACK_FLUSH_S = 5.0
# The agent's runner already gathers events for CLOCKTOWER_AGENT_FLUSH_MS, so librdkafka's own linger (20 ms in
# KafkaPublisher) would only delay a carrier loss that the runner sends at once (_urgent).
AGENT_LINGER_MS = 0
# pyroute2 forks helpers for namespaces (CLOCKTOWER_AGENT_NETNS) and stops them with SIGTERM; a helper keeping the
# agent's SIGTERM handler (set a stop flag) would not exit, and the agent would wait on it forever.
pyroute2_config.disable_mp_signal = True


def add_parser(sub: argparse._SubParsersAction) -> None:
    a = sub.add_parser("agent", help="run the node agent (GPU health, eBPF flows, links, clock probes)")
    a.add_argument("action", nargs="?", choices=("run", "setup-ebpf"), default="run", help=(
        "run (the default), or setup-ebpf: make this Debian node ready for the eBPF sources (as root: BCC from "
        "apt, kernel headers, tracefs; what `make setup-ebpf` does in a checkout)"))
    a.add_argument("--node", help="this node's name (default: hostname, or CLOCKTOWER_AGENT_NODE)")
    a.add_argument("--stdout", action="store_true", help="print event batches as JSON lines instead of Kafka")
    a.add_argument("--duration", type=float, help="stop after S seconds (default: until Ctrl-C or SIGTERM)")
    a.add_argument("--json", action="store_true", help="at the end, print event counts per source as JSON")
    a.add_argument("--kafka", help="bootstrap servers (default CLOCKTOWER_KAFKA_BOOTSTRAP, else 127.0.0.1:9092)")
    a.add_argument("--kafka-port", type=int, help="the broker on this host: 127.0.0.1:PORT (default 9092), as "
                                                  "for the other commands; --kafka for another host")
    a.add_argument("--sources", help=f"comma-separated subset of {','.join(ALL_SOURCES)} (default: all)")
    a.add_argument("--start-timeout", type=float, help="give up a source not started after S seconds and run "
                                                       "without it (default 120; the eBPF compile takes ~10)")
    a.add_argument("--gpu-hz", type=float, help="GPU readings per second per GPU (default 10)")
    a.add_argument("--heartbeat-s", type=float, help="heartbeat period in s (default 0.2): the pipeline calls a node "
                                                     "silent after 5 missed, at least 1 s")
    a.add_argument("--nvml-library", help="path of libnvidia-ml.so.1 (default: the system's)")
    a.add_argument("--flow-drain-ms", type=float, help="eBPF map drain period in ms (default 100)")
    a.add_argument("--flow-slot-ms", type=float, help="eBPF flow counter resolution in ms (default 10)")
    a.add_argument("--tc-interface", action="append", help="attach the tc flow classifier here (repeatable)")
    a.add_argument("--link-interface", action="append", help="watch only these interfaces (default: all but lo)")
    a.add_argument("--clock-peer", action="append", help="a clock-probe peer host:port (repeatable)")
    a.add_argument("--clock-bind", help="clock-probe UDP host:port (default: port 7373 on --clock-interface's "
                                        "address, else on the address that reaches the first peer)")
    a.add_argument("--clock-bind-any", action="store_true", help="allow a wildcard --clock-bind (0.0.0.0 or ::)")
    a.add_argument("--clock-interface", help="the cluster NIC clock probes use (sets the default --clock-bind)")
    a.add_argument("--clock-key-file", help="the cluster's clock-probe key, a 0600 file (default "
                                            "CLOCKTOWER_CLOCK_KEY_FILE); without one the clock source is off")
    a.add_argument("--gen-clock-key", metavar="PATH", help="write a new random clock key to PATH (0600) and exit; "
                                                           "copy it to every node")
    a.add_argument("--spool-dir", help="on-disk spool while the broker is away (default .clocktower-agent/spool)")
    a.add_argument("--compression", choices=("lz4", "zstd"), help="Kafka record compression (default lz4)")
    a.add_argument("--actuate", action="store_true", help="also run this node's actuator: apply its signed control "
                   "commands (routes, drain/spare hooks) and ack them; needs Kafka and the controller's public key "
                   "(CLOCKTOWER_CONTROL_PUBLIC_KEY_FILE; CLOCKTOWER_ACTUATOR_* for the state dir and hooks)")
    a.set_defaults(agent_options={act.dest: act.option_strings[-1] for act in a._actions   # noqa: SLF001
                                  if act.option_strings and act.dest != "help"})


def _settings(args: argparse.Namespace) -> AgentSettings:
    pairs = {"node": args.node, "gpu_hz": args.gpu_hz, "heartbeat_s": args.heartbeat_s,
             "nvml_library": args.nvml_library,
             "flow_drain_ms": args.flow_drain_ms, "flow_slot_ms": args.flow_slot_ms,
             "tc_interfaces": args.tc_interface,
             "link_interfaces": args.link_interface, "clock_peers": args.clock_peer, "clock_bind": args.clock_bind,
             "clock_bind_any": args.clock_bind_any or None, "clock_interface": args.clock_interface,
             "clock_key_file": args.clock_key_file,
             "spool_dir": args.spool_dir, "compression": args.compression, "start_timeout_s": args.start_timeout,
             "sources": tuple(s.strip() for s in args.sources.split(",") if s.strip()) if args.sources else None}
    return AgentSettings(**{k: v for k, v in pairs.items() if v is not None}, **_profile(args))


def _profile(args: argparse.Namespace) -> dict[str, str]:
    """--kafka-port names the embedded broker `up` runs on this host: its workarounds, unless the profile is set."""
    if getattr(args, "kafka_port", None) is not None and "CLOCKTOWER_BROKER_PROFILE" not in os.environ:
        return {"broker_profile": "embedded"}
    return {}


def _bootstrap(args: argparse.Namespace) -> str:
    """--kafka, else --kafka-port on this host, else CLOCKTOWER_KAFKA_BOOTSTRAP / _KAFKA_PORT as `up` has them."""
    if args.kafka and args.kafka_port is not None:
        raise UserError("give --kafka HOST:PORT or --kafka-port PORT, not both")
    if args.kafka:
        return args.kafka
    if args.kafka_port is not None:
        return Settings(kafka_port=args.kafka_port, kafka_bootstrap=None).bootstrap
    return Settings().bootstrap


def _publisher(bootstrap: str, settings: AgentSettings) -> SpoolingPublisher:
    try:
        return SpoolingPublisher(bootstrap, settings.spool_dir, compression=settings.compression,
                                 ack_hold_s=profile_settings(settings.broker_profile).ack_hold_s,
                                 max_spool_bytes=int(settings.spool_max_mb * 2**20),
                                 extra_config={"linger.ms": AGENT_LINGER_MS})   # signs: CLOCKTOWER_NODE_KEY,
                                 # else beside `up` with `up`'s key (runtime/local_signing.py)
    except SpoolInUse as exc:
        raise UserError(f"{exc} (--spool-dir)") from None


def _serve_metrics(settings: AgentSettings, publisher: SpoolingPublisher | None) -> None:
    """The spool's depth as gauges, and, with CLOCKTOWER_AGENT_METRICS_PORT, the Prometheus endpoint."""
    from prometheus_client import start_http_server

    from clocktower.producers.agent import metrics

    if publisher is not None:
        metrics.SPOOL_RECORDS.set_function(lambda: publisher.spool.pending_records)
        metrics.SPOOL_EVENTS.set_function(lambda: publisher.spool.pending_events)
    if settings.metrics_port:
        try:
            start_http_server(settings.metrics_port, addr=settings.metrics_host)
        except OSError as exc:
            raise UserError(f"cannot serve metrics on {settings.metrics_host}:{settings.metrics_port}: "
                            f"{exc.strerror or exc} (CLOCKTOWER_AGENT_METRICS_PORT)") from None


def kernel_routing(settings: ActuatorSettings, netns: str | None = None) -> LinkRouting:
    """The real routing backend: the kernel's tables through pyroute2, its remembered routes in the state dir;
    `netns` (CLOCKTOWER_AGENT_NETNS) moves the routes of that named network namespace instead of this one's."""
    from clocktower.actuators.route_table import KernelRouting  # pyroute2 only where it is used
    if not _has_net_admin():
        raise PermissionError("changing routes needs CAP_NET_ADMIN: run the agent as root, or grant it the capability")
    private_dir(settings.state_dir)   # before KernelRouting reads routes.json there: 0700, this user's, no symlink
    return KernelRouting(settings.state_dir / "routes.json", netns=netns)


def _has_net_admin() -> bool:
    """Whether this process holds CAP_NET_ADMIN (bit 12 of CapEff), which route changes need."""
    try:
        with open("/proc/self/status") as f:
            caps = next((line.split()[1] for line in f if line.startswith("CapEff:")), "0")
        return bool(int(caps, 16) >> 12 & 1)
    except (OSError, ValueError):
        return False


class _Actuation:
    """What --actuate adds: the actuator component and the local watchdog, sharing one routing backend (two
    KernelRouting objects on one state file would disagree about what was moved)."""

    def __init__(self, node: str, bootstrap: str, netns: str | None = None,
                 durable_publish: Callable[[list[Event]], None] | None = None,
                 profile: dict[str, str] | None = None, topology: Callable[[], PortTopology] | None = None) -> None:
        self.settings = ActuatorSettings(**(profile or {}))
        self.emit: Callable[[list[Event]], None] = lambda events: None   # the runner's, once it exists
        self.routing: LinkRouting | None = None
        self.routing_error: Exception | None = None
        try:
            self.routing = kernel_routing(self.settings, netns)
        except (PermissionError, OSError, UserError) as exc:   # the component reports itself off with this reason,
            # and no watchdog runs (it shares this routing: a state dir the actuator refuses is refused for both)
            self.routing_error = exc
        topo = topology or PortTopology   # none: no backup known, so no link is moved by a command
        self.component = ActuatorComponent(node, bootstrap, self._routing, self.settings,
                                           durable_publish=durable_publish,
                                           backups=lambda link: topo().backup_of(link), netns=netns)
        self.watchdog = None if self.routing is None else LinkWatchdog(
            node, self.routing, {}, lambda ack: self.emit([ack]), delay_s=self.settings.watchdog_ms / 1e3)

    def _routing(self) -> LinkRouting:
        if self.routing is None:
            raise self.routing_error or RuntimeError("no routing backend")
        return self.routing

    def watch(self, sources: list) -> None:   # noqa: ANN001 - agent sources
        """Feed the watchdog from the link source (on its own thread: no queue between carrier loss and failover),
        and stamp the link source's reports with what this node did (`view`)."""
        for src in sources:
            if isinstance(src, LinkSource):
                src.actuator_view = self.view
                if self.watchdog is not None:
                    src.listeners = (*src.listeners, self.watchdog.observe)

    def view(self, link: str) -> tuple[bool | None, bool | None]:
        """(on_backup, quarantined) of `link`: the routing backend's (the watchdog's moves and the commands') and
        the actuator's quarantine marks; None where this node cannot know (no routing, the actuator not started)."""
        on_backup = None if self.routing is None else self.routing.on_backup(link)
        return on_backup, self.component.quarantined(link)

    def stop(self) -> None:
        if self.watchdog is not None:
            self.watchdog.stop()


def _urgent(event: Event) -> bool:
    """A link reported down goes to Kafka at once, not with the next batch: the pipeline's failover waits for it."""
    return isinstance(event, LinkState) and not event.up


def _acks_to(publisher: SpoolingPublisher | None) -> Callable[[list[Event]], None] | None:
    """Acks straight to the spooling publisher, returning once the broker acknowledged them (clocktower/
    durable_acks.py): the actuator commits the command's offset right after."""
    return None if publisher is None else delivered_publisher(publisher, ACK_FLUSH_S)


def _actuation(args: argparse.Namespace, node: str, bootstrap: str | None,
               netns: str | None = None, publisher: SpoolingPublisher | None = None,
               topology: Callable[[], PortTopology] | None = None) -> _Actuation | None:
    """The actuator and watchdog when --actuate is given (the component's check says whether it can run here)."""
    if not args.actuate:
        return None
    if bootstrap is None:
        raise UserError("--actuate needs Kafka: it reads control.commands and acks through the publisher "
                        "(drop --stdout)")
    return _Actuation(node, bootstrap, netns, _acks_to(publisher), _profile(args), topology)


def _wait_running(runner: AgentRunner, view: SourceTableView, stop: threading.Event) -> None:
    """Show the table at once and update it until every source is running, off or failed (or a stop)."""
    runner.wait_started(0.25)                 # quick checks settle first: fewer lines in a log
    view.update(runner.report())
    while not stop.is_set() and not runner.wait_started(0.1):
        view.update(runner.report())
    view.update(runner.report())


def setup_ebpf() -> int:
    """Run the packaged setup_bcc.sh for this Python environment; its output goes straight to the terminal."""
    if not SETUP_SCRIPT.is_file():
        raise UserError(f"{SETUP_SCRIPT} is missing from this installation")
    env = {**os.environ, "CLOCKTOWER_HEADERS_CACHE": str(headers_cache()), "CLOCKTOWER_PYTHON": sys.executable}
    return subprocess.run(["bash", str(SETUP_SCRIPT), sys.prefix], env=env).returncode


def cmd_agent(args: argparse.Namespace, console: Console) -> int:
    if args.action == "setup-ebpf":
        given = [flag for dest, flag in args.agent_options.items()   # `--duration 0` is given: 0 == False
                 if getattr(args, dest) is not None and getattr(args, dest) is not False]
        if given:
            raise UserError(f"setup-ebpf takes no option ({', '.join(given)} given): it only readies this node "
                            "for the eBPF sources; run the agent with them afterwards")
        return setup_ebpf()
    if args.gen_clock_key:
        try:
            path = generate_key_file(args.gen_clock_key)
        except ClockKeyError as exc:
            raise UserError(str(exc)) from None
        console.print(f"wrote a new clock key to {path} (0600): copy it to every node, then pass "
                      f"--clock-key-file {path} (or set CLOCKTOWER_CLOCK_KEY_FILE)")
        return 0
    if args.duration is not None and args.duration <= 0:
        raise UserError("--duration must be > 0")
    if args.json and args.duration is None:
        raise UserError("--json needs --duration (the counts are printed at the end of the run)")
    settings = _settings(args)
    try:
        topology = topology_for(settings)   # one for the sources' reports and the actuator's check of backups
        sources = build_sources(settings, topology)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    err = consoles.console(stderr=True)
    bootstrap = None if args.stdout else _bootstrap(args)
    publisher = None if bootstrap is None else _publisher(bootstrap, settings)
    _serve_metrics(settings, publisher)
    sink: Sink = JsonLinesSink() if publisher is None else publisher.publish
    actuation = _actuation(args, settings.node, bootstrap, settings.netns, publisher, topology)
    actuators = [] if actuation is None else [actuation.component]
    runner = AgentRunner(sources, sink, start_timeout_s=settings.start_timeout_s,
                         flush_interval_s=settings.flush_ms / 1e3,
                         refused=None if publisher is None else lambda: publisher.refused, actuators=actuators,
                         urgent=_urgent)
    if actuation is not None:
        actuation.emit = runner.emit
        actuation.watch(sources)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGHUP):      # a closed terminal stops the agent cleanly too (not nohup)
        if not (sig == signal.SIGHUP and signal.getsignal(sig) == signal.SIG_IGN):
            signal.signal(sig, lambda *_: stop.set())
    running_at: float | None = None
    seconds = 0.0
    try:
        runner.start()
        with SourceTableView(err) as view:
            _wait_running(runner, view, stop)
        running_at = time.monotonic()            # --duration counts from here, not from the process start
        gc.freeze()   # start-up's objects leave the collector: a full collection stalled a failover by 40-160 ms
        if not any(s.enabled for s in runner.status.values() if s.kind == "source"):
            err.print("[yellow]no source can run on this machine[/yellow]")
        deadline = running_at + args.duration if args.duration else None
        while not stop.is_set() and (deadline is None or time.monotonic() < deadline):
            stop.wait(0.2 if deadline is None else max(0.0, min(0.2, deadline - time.monotonic())))
    except KeyboardInterrupt:
        pass
    finally:
        if running_at is not None:
            seconds = time.monotonic() - running_at
        if actuation is not None:
            actuation.stop()
        runner.stop()
        if publisher is not None:   # deliver for up to 10 s if the broker is there; else it stays spooled
            publisher.close(timeout=10.0 if publisher.broker_up else 0.0)
    report = runner.report() | {"node": settings.node, "seconds": round(seconds, 3)}
    if actuation is not None and actuation.watchdog is not None:
        wd = actuation.watchdog
        report["watchdog"] = {"failovers": wd.failovers, "failures": wd.failures, "delay_ms": wd.delay_s * 1e3}
    for act in actuators:
        report["actuators"][act.name]["consumer"] = act.stats()
    if publisher is not None:
        report["kafka"] = bootstrap
        report["publisher"] = publisher.stats()
    if args.json:
        print(orjson.dumps(report).decode())
    return 0
