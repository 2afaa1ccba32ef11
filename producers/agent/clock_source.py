"""The clock-probe agent (producers/clock) as a node-agent source, so one agent process runs everything."""

from __future__ import annotations

from collections import Counter

from producers.agent.source import Availability, Emit
from producers.clock.probe_agent import ProbeAgent, ProbeAgentConfig
from schemas.telemetry import ClockProbe


class ClockProbeSource:
    name = "clock"

    def __init__(self, node: str, bind: str, peers: tuple[str, ...], probe_peers: int = 10,
                 pairs_per_s: float = 10.0, timestamping: str = "software") -> None:
        self.counts: Counter[str] = Counter()
        self._config = (ProbeAgentConfig(node=node, bind=bind, peers=peers, probe_peers=probe_peers,
                                         pairs_per_s=pairs_per_s, timestamping=timestamping)  # type: ignore[arg-type]
                        if peers else None)
        self._agent: ProbeAgent | None = None

    def check(self) -> Availability:
        if self._config is None:
            return Availability(False, "no clock peers given (--clock-peer HOST:PORT): probing needs peers")
        return Availability(True, f"probing {min(self._config.probe_peers, len(self._config.peers))} of "
                                  f"{len(self._config.peers)} peers from {self._config.bind}")

    def start(self, emit: Emit) -> None:
        assert self._config is not None

        def sink(events: list[ClockProbe]) -> None:
            self.counts[ClockProbe.SCHEMA] += len(events)
            emit(list(events))

        self._agent = ProbeAgent(self._config, sink).start()

    def stop(self) -> None:
        if self._agent is not None:
            self._agent.stop()
