"""`python -m clocktower.producers.clock.probe_agent`: run one clock-probe agent (events to Kafka, or JSON lines)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Sequence

from clocktower.producers.clock.config import ProbeAgentConfig
from clocktower.producers.clock.endpoints import DEFAULT_PORT
from clocktower.producers.clock.key import ENV_VAR as KEY_ENV_VAR
from clocktower.producers.clock.key import ClockKeyError, generate_key_file, load_key
from clocktower.producers.clock.probe_agent import ProbeAgent, ProbeAgentError, Sink
from clocktower.schemas.telemetry import ClockProbe


def _read_peers(args: argparse.Namespace) -> tuple[str, ...]:
    peers = list(args.peer or ())
    if args.peers_file:
        with open(args.peers_file, encoding="utf-8") as f:
            peers += [line.split("#", 1)[0].strip() for line in f if line.split("#", 1)[0].strip()]
    return tuple(peers)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m clocktower.producers.clock.probe_agent`: run one agent; events to Kafka, or JSON lines on stdout."""
    parser = argparse.ArgumentParser(prog="python -m clocktower.producers.clock.probe_agent", description=main.__doc__)
    parser.add_argument("--node", default=socket.gethostname(), help="this node's name (default: hostname)")
    parser.add_argument("--bind", help=f"host:port to send and receive on (default: port {DEFAULT_PORT} on the "
                                       "address of --interface, else of the interface that reaches the first peer)")
    parser.add_argument("--bind-any", action="store_true", help="allow a wildcard --bind (0.0.0.0 or ::)")
    parser.add_argument("--key-file", default=os.environ.get(KEY_ENV_VAR),
                        help=f"the cluster's clock key, a 0600 file (default ${KEY_ENV_VAR}); required")
    parser.add_argument("--gen-key", metavar="PATH", help="write a new random clock key to PATH (0600) and exit")
    parser.add_argument("--peer", action="append", help="a peer's host:port (repeatable)")
    parser.add_argument("--peers-file", help="file with one peer host:port per line")
    parser.add_argument("--probe-peers", type=int, default=10, help="K: peers to probe, chosen at random")
    parser.add_argument("--rate", type=float, default=10.0, help="R: probe pairs per second per peer")
    parser.add_argument("--spacing-us", type=float, default=10.0, help="s: microseconds between a pair's probes")
    parser.add_argument("--no-warm-up", action="store_true", help="send no warm-up datagram before each pair")
    parser.add_argument("--no-probe-back", action="store_true", help="do not probe the nodes that probe us")
    parser.add_argument("--timestamping", choices=("software", "hardware", "auto"), default="software")
    parser.add_argument("--interface", help="the cluster NIC: the default bind, and hardware timestamping")
    parser.add_argument("--duration", type=float, default=0.0, help="seconds to run (default: until a signal)")
    parser.add_argument("--kafka", help="bootstrap servers; without it, events are printed as JSON lines")
    parser.add_argument("--stats-file", help="write the final stats() as JSON here")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.duration < 0:
        parser.error("--duration must be >= 0")
    if args.gen_key:
        try:
            print(f"wrote a new clock key to {generate_key_file(args.gen_key)}: copy it (0600) to every node")
        except ClockKeyError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        return 0
    if not args.key_file:
        print(f"error: no clock key: pass --key-file PATH or set {KEY_ENV_VAR} (make one with --gen-key PATH); "
              "without it anyone could forge probes", file=sys.stderr)
        return 2
    publisher = None
    try:
        config = ProbeAgentConfig(node=args.node, key=load_key(args.key_file), bind=args.bind,
                                  allow_any_bind=args.bind_any, peers=_read_peers(args),
                                  probe_peers=args.probe_peers, pairs_per_s=args.rate,
                                  pair_spacing_us=args.spacing_us, timestamping=args.timestamping,
                                  interface=args.interface, seed=args.seed, warm_up=not args.no_warm_up,
                                  probe_back=not args.no_probe_back)
        if args.kafka:
            from clocktower.producers.kafka_publisher import KafkaPublisher
            publisher = KafkaPublisher(args.kafka)
            sink: Sink = publisher.publish
        else:
            def sink(events: list[ClockProbe]) -> None:
                sys.stdout.write("".join(e.model_dump_json() + "\n" for e in events))
                sys.stdout.flush()
        agent = ProbeAgent(config, sink).start()
    except (ValueError, OSError, ProbeAgentError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    done = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: done.set())
    done.wait(args.duration or None)
    agent.stop()
    if publisher is not None:
        publisher.flush(10.0)
    if args.stats_file:
        import json
        with open(args.stats_file, "w", encoding="utf-8") as f:
            json.dump(agent.stats(), f, indent=1)
    if agent.failure is not None:
        print(f"error: the agent failed: {agent.failure}", file=sys.stderr)
        return 1
    return 0

