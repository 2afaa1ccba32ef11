"""Builds the node agent's sources from its settings. A source whose module cannot even be imported here
(a missing library) is still listed, off, with the import error as its reason. The "links" and "ib" sources
share one port topology (port_topology.TopologyCache), so a port's netdev and backup read the same on both."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from functools import partial

from clocktower.producers.agent.config import ALL_SOURCES, AgentSettings
from clocktower.producers.agent.port_topology import TopologyCache, discover
from clocktower.producers.agent.source import Availability, Emit, Source


class UnavailableSource:
    """Stands in for a source that cannot be built on this machine; `check()` says why."""

    def __init__(self, name: str, reason: str) -> None:
        self.name = name
        self.reason = reason
        self.counts: Counter[str] = Counter()

    def check(self) -> Availability:
        return Availability(False, self.reason)

    def start(self, emit: Emit) -> None:
        raise RuntimeError(self.reason)

    def stop(self) -> None:
        return None


def _gpu(s: AgentSettings, _: TopologyCache) -> Source:
    from clocktower.producers.agent.gpu_source import GpuSource
    return GpuSource(s.node, hz=s.gpu_hz, library_path=s.nvml_library)


def _flows(s: AgentSettings, _: TopologyCache) -> Source:
    from clocktower.producers.agent.ebpf.flow_source import FlowSource
    return FlowSource(s.node, drain_ms=s.flow_drain_ms, kernel_source=s.kernel_source, tc_interfaces=s.tc_interfaces,
                      max_flows=s.flow_max_entries, slot_ms=s.flow_slot_ms)


def _links(s: AgentSettings, topology: TopologyCache) -> Source:
    from clocktower.producers.agent.link_source import LinkSource
    return LinkSource(s.node, interfaces=s.link_interfaces, report_interval_s=s.link_report_s, topology=topology,
                      netns=s.netns)


def _ib(s: AgentSettings, topology: TopologyCache) -> Source:
    from clocktower.producers.agent.ib_sysfs import IbPortSource
    return IbPortSource(s.node, root=s.ib_sysfs_root, interval_s=s.ib_poll_s, topology=topology)


def _clock(s: AgentSettings, _: TopologyCache) -> Source:
    from clocktower.producers.agent.clock_source import ClockProbeSource
    return ClockProbeSource(s.node, s.clock_bind, s.clock_peers, pairs_per_s=s.clock_pairs_per_s,
                            key_file=s.clock_key_file, interface=s.clock_interface, allow_any_bind=s.clock_bind_any)


def _heartbeat(s: AgentSettings, _: TopologyCache) -> Source:
    from clocktower.producers.agent.heartbeat_source import HeartbeatSource
    return HeartbeatSource(s.node, s.heartbeat_s)


def topology_for(s: AgentSettings) -> TopologyCache:
    """The node's port topology from its settings; nothing is read until a source first asks."""
    return TopologyCache(partial(discover, s.ib_sysfs_root, s.link_backups, s.backups_from_routes, netns=s.netns),
                         refresh_s=s.topology_refresh_s)


BUILDERS: dict[str, Callable[[AgentSettings, TopologyCache], Source]] = {
    "gpu": _gpu, "flows": _flows, "links": _links, "ib": _ib, "clock": _clock, "heartbeat": _heartbeat,
}
assert set(BUILDERS) == set(ALL_SOURCES)


def build_sources(settings: AgentSettings, topology: TopologyCache | None = None) -> list[Source]:
    """The sources `settings` name, sharing `topology` (the node's port topology; built from `settings` if None)."""
    unknown = set(settings.sources) - set(BUILDERS)
    if unknown:
        raise ValueError(f"unknown source(s) {sorted(unknown)}: choose from {', '.join(ALL_SOURCES)}")
    out: list[Source] = []
    topology = topology or topology_for(settings)
    for name in settings.sources:
        try:
            out.append(BUILDERS[name](settings, topology))
        except ImportError as exc:
            out.append(UnavailableSource(name, f"cannot import its module: {exc}"))
    return out
