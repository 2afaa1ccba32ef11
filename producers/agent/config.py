"""The node agent's settings (CLOCKTOWER_AGENT_* environment variables; `clocktower agent` flags override)."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

ALL_SOURCES = ("gpu", "flows", "links", "ib", "clock")


class AgentSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CLOCKTOWER_AGENT_", extra="ignore", populate_by_name=True)

    node: str = Field(default_factory=socket.gethostname, min_length=1, max_length=256)
    sources: tuple[str, ...] = ALL_SOURCES
    start_timeout_s: float = Field(default=120.0, gt=0, le=3600, description=(
        "a source not started by then is given up (failed) and the run goes on without it; BCC's compile of "
        "the flow source takes 7-13 s"))
    gpu_hz: float = Field(default=10.0, gt=0, le=1000)
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
    link_report_s: float = Field(default=1.0, ge=0, le=3600, description=(
        "re-send every link's state this often (0: changes only); detectors need reports to see stability"))
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
