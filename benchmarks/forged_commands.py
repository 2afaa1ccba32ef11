"""What a flood of forged control commands costs a node's actuator, per command, beside genuine ones (issue 18).

A local user without the control key can still write `control.commands`. Every forged command must be refused
before any other work, and must cost little enough that genuine commands don't wait behind a flood. Genuine
commands expire 60 s after they are issued.

This runs the actuator's real record path (CommandConsumer.handle: decode, Ed25519 check, refusal, rate-limited
refused acks) in one process, on records of 100 commands each, the way the flood came in issue 18. The cost is
the CPU time per command. Prints one JSON object:
- `forged_us_per_command`: a command signed by another key;
- `genuine_us_per_command`: a signed, applied failover, on simulated routing, with the replay memory on disk;
- `forged_us_per_command_logging_each`: the same with a WARNING line per refused command, as before issue 18
  (now at most 20 a second after a burst of 200, the rest counted), and `logging_each_over_limited`, the ratio;
- `forged_per_s_one_core`: how many forged commands one core refuses per second;
- `flood_delay_s_per_100k`: how long 100k forged commands delay the genuine one behind them.

    python benchmarks/forged_commands.py [--commands 20000] [--quick]
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from clocktower.actuators.actuator import Actuator
from clocktower.actuators.command_consumer import CommandConsumer
from clocktower.actuators.hooks import Hooks
from clocktower.actuators.quarantine import Quarantine
from clocktower.actuators.seen_commands import SeenCommands
from clocktower.actuators.simulated_routing import SimulatedRouting
from clocktower.control.intent import CommandIntent
from clocktower.control.issuer import CommandIssuer
from clocktower.control.signing import CommandSigner
from clocktower.runtime.rate_limit import TokenBucket
from clocktower.schemas.codec import encode_batch

NODE = "node-a"
PER_RECORD = 100


class _Record:
    """A consumed record, as CommandConsumer.handle reads it."""

    def __init__(self, offset: int, key: bytes, value: bytes, headers: list) -> None:
        self._offset, self._key, self._value, self._headers = offset, key, value, headers

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return "control.commands"

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes:
        return self._key

    def value(self) -> bytes:
        return self._value

    def headers(self) -> list:
        return self._headers


def _records(signer: CommandSigner, n: int, start: int) -> list[_Record]:
    issuer = CommandIssuer(signer)
    now = time.time_ns()
    cmds = [issuer.issue(CommandIntent(NODE, "failover", "eth0", now + i, f"inc-{start + i}",
                                       {"from": "eth0", "to": "eth1"})) for i in range(n)]
    return [_Record(start + i, *encode_batch(cmds[i:i + PER_RECORD])) for i in range(0, n, PER_RECORD)]


def _cpu_us_per_command(consumer: CommandConsumer, records: list[_Record], n: int) -> float:
    started = time.process_time()
    for rec in records:
        consumer.handle(rec)   # type: ignore[arg-type]
    return (time.process_time() - started) / n * 1e6


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")   # as the agent logs
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--commands", type=int, default=20_000, help="forged commands (genuine: a tenth of it)")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 2,000 forged commands")
    args = ap.parse_args()
    n = 2_000 if args.quick else args.commands
    genuine_key = CommandSigner(Ed25519PrivateKey.generate())
    with tempfile.TemporaryDirectory(prefix="ct-forged-") as tmp:
        state = Path(tmp)
        routing = SimulatedRouting()
        actuator = Actuator(NODE, genuine_key.verifier(), routing, SeenCommands(state), Quarantine(state), Hooks({}),
                            backups=lambda link: "eth1")
        consumer = CommandConsumer("127.0.0.1:9", actuator, lambda events: None)
        forger = CommandSigner(Ed25519PrivateKey.generate())
        forged = _records(forger, n, 0)
        genuine = _records(genuine_key, max(PER_RECORD, n // 10), n)
        logging_each = _records(forger, n, 10 * n)
        forged_us = _cpu_us_per_command(consumer, forged, n)
        actuator._refusal_lines = TokenBucket(1e12, 1e12, time.time_ns())   # noqa: SLF001 - every refusal logged
        logging_each_us = _cpu_us_per_command(consumer, logging_each, n)
        genuine_us = _cpu_us_per_command(consumer, genuine, max(PER_RECORD, n // 10))
        counts = consumer.stats()
        consumer.close()
    assert counts["acks_refused"] == 2 * n and counts["acks_applied"] == max(PER_RECORD, n // 10), counts
    print(json.dumps({
        "benchmark": "forged_commands", "commands_forged": n,
        "forged_us_per_command": round(forged_us, 1),
        "forged_us_per_command_logging_each": round(logging_each_us, 1),
        "logging_each_over_limited": round(logging_each_us / forged_us, 2),
        "genuine_us_per_command": round(genuine_us, 1),
        "forged_per_s_one_core": round(1e6 / forged_us),
        "flood_delay_s_per_100k": round(forged_us * 1e5 / 1e6, 2),
        "refused_acks_published": 2 * n - counts["refused_acks_dropped"],
    }))


if __name__ == "__main__":
    main()
