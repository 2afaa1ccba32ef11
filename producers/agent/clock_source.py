"""The clock-probe agent (producers/clock) as a node-agent source, so one agent process runs everything.

The source is off, saying why, without a clock key (probes anyone could forge would corrupt every
clock estimate) or without peers; a key file that is unsafe or unreadable also leaves it off, and so
does a configuration the probe agent refuses (no route to the first peer at boot, an interface without
an address, a wildcard bind): the other sources of the agent still run.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from clocktower.producers.agent.source import Availability, Emit
from clocktower.producers.clock.config import ProbeAgentConfig
from clocktower.producers.clock.key import ENV_VAR, ClockKeyError, load_key
from clocktower.producers.clock.probe_agent import ProbeAgent
from clocktower.schemas.telemetry import ClockProbe


class ClockProbeSource:
    name = "clock"

    def __init__(self, node: str, bind: str | None, peers: tuple[str, ...], probe_peers: int = 10,
                 pairs_per_s: float = 10.0, timestamping: str = "software", key_file: Path | None = None,
                 interface: str | None = None, allow_any_bind: bool = False) -> None:
        self.counts: Counter[str] = Counter()
        self._config: ProbeAgentConfig | None = None
        self._off: str | None = None
        if not peers:
            self._off = "no clock peers given (--clock-peer HOST:PORT): probing needs peers"
        elif key_file is None:
            self._off = (f"no clock key (--clock-key-file PATH or {ENV_VAR}; make one with `clocktower agent "
                         f"--gen-clock-key PATH` and copy it to every node): unauthenticated probes could be forged")
        else:
            try:
                key = load_key(key_file)
            except ClockKeyError as exc:
                self._off = str(exc)
            else:
                try:
                    self._config = ProbeAgentConfig(
                        node=node, key=key, bind=bind, peers=peers, probe_peers=probe_peers, pairs_per_s=pairs_per_s,
                        timestamping=timestamping, interface=interface,  # type: ignore[arg-type]
                        allow_any_bind=allow_any_bind)
                except ValueError as exc:
                    self._off = f"{exc} (the clock source stays off until the agent restarts)"
        self._agent: ProbeAgent | None = None

    def check(self) -> Availability:
        if self._config is None:
            return Availability(False, self._off or "off")
        return Availability(True, f"probing {min(self._config.probe_peers, len(self._config.peers))} of "
                                  f"{len(self._config.peers)} peers from {self._config.bind_address} "
                                  f"(MAC-authenticated, listed peers only)")

    def start(self, emit: Emit) -> None:
        assert self._config is not None

        def sink(events: list[ClockProbe]) -> None:
            self.counts[ClockProbe.SCHEMA] += len(events)
            emit(list(events))

        self._agent = ProbeAgent(self._config, sink).start()

    def stop(self) -> None:
        if self._agent is not None:
            self._agent.stop()
