"""The node agent's settings (CLOCKTOWER_AGENT_* environment variables; `clocktower agent` flags override)."""

from __future__ import annotations

import re
import socket
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from clocktower.runtime.broker_profile import BrokerProfile, profile_field
from clocktower.runtime.setting_text import json_or_text

ALL_SOURCES = ("gpu", "flows", "links", "ib", "clock", "heartbeat")
_PORT_NAME = re.compile(r"^[A-Za-z0-9_.:@/-]{1,64}$")    # a netdev ("eth0") or an RDMA port ("mlx5_0/1")


def _pairs(text: str) -> dict[str, str]:
    """`eth0=eth1,ib0=ib1` -> {"eth0": "eth1", "ib0": "ib1"}."""
    pairs: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        primary, eq, backup = item.partition("=")
        if not eq:
            raise ValueError(f"link_backups item {item!r} is not PRIMARY=BACKUP")
        if primary.strip() in pairs:
            raise ValueError(f"link_backups names {primary.strip()!r} twice")
        pairs[primary.strip()] = backup.strip()
    return pairs


def parse_link_backups(value: Any) -> dict[str, str]:
    """`{"eth0": "eth1"}` (a dict or its JSON) or `eth0=eth1,ib0=ib1` -> {primary: backup}; ValueError says why."""
    value = json_or_text(value, "{", "link_backups", _pairs)
    if not isinstance(value, dict):
        raise ValueError("link_backups must be a JSON object or PRIMARY=BACKUP,... pairs")
    out: dict[str, str] = {}
    for primary, backup in value.items():
        for name in (primary, backup):
            if not isinstance(name, str) or not _PORT_NAME.match(name):
                raise ValueError(f"link_backups: {name!r} is not a port name (1-64 of A-Z a-z 0-9 _ . : @ / -)")
        if primary == backup:
            raise ValueError(f"link_backups: {primary!r} cannot be its own backup")
        out[primary] = backup
    return out


class AgentSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CLOCKTOWER_AGENT_", extra="ignore", populate_by_name=True)

    node: str = Field(default_factory=socket.gethostname, min_length=1, max_length=256)
    broker_profile: BrokerProfile = profile_field()   # the spooling publisher holds acked records only if `embedded`
    sources: tuple[str, ...] = ALL_SOURCES
    start_timeout_s: float = Field(default=120.0, gt=0, le=3600, description=(
        "a source not started by then is given up (failed) and the run goes on without it; BCC's compile of "
        "the flow source takes 7-13 s"))
    gpu_hz: float = Field(default=10.0, gt=0, le=1000)
    heartbeat_s: float = Field(default=0.2, gt=0, le=3600, description=(
        "how often the agent says it is alive; the pipeline calls a node silent after 5 missed heartbeats, at "
        "least 1 s"))
    nvml_library: str | None = Field(default=None, description="path of libnvidia-ml.so.1 (default: the system's)")
    flow_slot_ms: float = Field(default=10.0, gt=0, le=60_000, description="resolution of the eBPF flow counters")
    flow_drain_ms: float = Field(default=100.0, gt=0, le=60_000, description=(
        "how often the agent reads the BPF maps: each read returns the finished slots (10 drains/s cost "
        "a third of the CPU of 100/s, measured)"))
    flow_max_entries: int = Field(default=2048, ge=64, le=1 << 20, description=(
        "distinct flows per drain period the BPF maps hold (more are counted as lost); a drain walks every "
        "bucket, so a larger map costs CPU even when idle"))
    tc_interfaces: tuple[str, ...] = ()
    kernel_source: str | None = Field(default=None, description="kernel headers for BCC (BCC_KERNEL_SOURCE)")
    link_interfaces: tuple[str, ...] | None = None
    flush_ms: float = Field(default=100.0, gt=0, le=60_000, description=(
        "how long the agent gathers events before handing them to Kafka: a link's carrier loss reaches the "
        "pipeline this much later, at most (the local watchdog does not wait for it)"))
    link_report_s: float = Field(default=1.0, ge=0, le=3600, description=(
        "re-send every link's state this often (0: changes only); detectors need reports to see stability"))
    link_backups: Annotated[dict[str, str], NoDecode] = Field(default_factory=dict, description=(
        "which port backs up which on this node, as JSON {\"eth0\": \"eth1\"} or eth0=eth1,ib0=ib1; wins over "
        "the routes, per primary; names are netdevs or RDMA ports (DEV/N)"))
    backups_from_routes: bool = Field(default=True, description=(
        "for a port with no configured backup, take one from the main routing table: a destination reachable "
        "through two devices (two metrics, or a multipath route) makes the lower metric's device the primary"))
    topology_refresh_s: float = Field(default=30.0, ge=0, le=86_400, description=(
        "how often the ports' netdevs and backups are discovered again (0: only at start)"))
    netns: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.-]{1,64}$", description=(
        "manage the links of another network namespace (containers, tests): a named netns (/var/run/netns/NAME) "
        "whose links the link source watches, whose routes the topology discovery reads and the actuator moves; "
        "the agent itself (its broker connection) stays in its own namespace"))
    ib_sysfs_root: Path = Path("/sys/class/infiniband")
    ib_poll_s: float = Field(default=1.0, gt=0, le=3600)
    clock_bind: str | None = Field(default=None, description=(
        "clock-probe UDP host:port (default: port 7373 on clock_interface's address, else on the address that "
        "reaches the first peer); a wildcard address needs clock_bind_any"))
    clock_bind_any: bool = False
    clock_interface: str | None = Field(default=None, description="the cluster NIC the clock probes use")
    clock_key_file: Path | None = Field(default=None, validation_alias=AliasChoices(
        "CLOCKTOWER_CLOCK_KEY_FILE", "CLOCKTOWER_AGENT_CLOCK_KEY_FILE"), description=(
        "the cluster's clock-probe key (0600 file, >= 32 bytes; `clocktower agent --gen-clock-key PATH`); "
        "without it the clock source is off"))
    clock_peers: tuple[str, ...] = ()
    clock_pairs_per_s: float = Field(default=10.0, gt=0, le=10_000)
    compression: Literal["lz4", "zstd"] = "lz4"
    spool_dir: Path = Path(".clocktower-agent/spool")
    spool_max_mb: float = Field(default=256.0, gt=0)
    metrics_port: int = Field(default=0, ge=0, le=65535, description=(
        "the agent's Prometheus endpoint (events, spool depth, the actuator's commands and command-to-ack time); "
        "0 disables it"))
    metrics_host: str = Field(default="127.0.0.1", description=(
        "where the Prometheus endpoint binds: the cluster interface's address for the fleet's Prometheus"))

    @field_validator("link_backups", mode="before")
    @classmethod
    def _link_backups(cls, value: Any) -> dict[str, str]:
        return parse_link_backups(value)
