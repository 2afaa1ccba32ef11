"""The fleet simulator's settings: fleet shape, training loop, telemetry rates and faults."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_NODES = 4096


class SimConfig(BaseModel):
    """How big the simulated fleet is, how it trains, and how often it reports.

    `duration_s` is the run the default fault schedule is scaled to; every fault
    falls inside it. The simulator itself can be advanced past it.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    nodes: int = 4
    gpus_per_node: int = Field(default=8, ge=1, le=64)
    duration_s: float = Field(default=60.0, ge=1.0, le=30 * 24 * 3600.0)
    seed: int = Field(default=0, ge=0, le=2**63 - 1)
    iteration_compute_ms: float = Field(default=200.0, ge=1.0, le=600_000.0)
    buckets: int = Field(default=4, ge=1, le=1024)
    bucket_bytes: int = Field(default=64 * 2**20, ge=1, le=2**40)
    segments_per_bucket: int = Field(default=8, ge=1, le=1024)
    gpu_health_hz: float = Field(default=10.0, gt=0.0, le=1000.0)
    link_report_hz: float = Field(default=1.0, gt=0.0, le=100.0)
    heartbeat_s: float = Field(default=0.2, gt=0.0, le=3600.0, description="each node agent's heartbeat period")
    probe_peers: int = Field(default=10, ge=1, le=MAX_NODES)
    probe_pairs_per_s: float = Field(default=10.0, gt=0.0, le=10_000.0)
    faults: bool = True
    schedule: Literal["default", "random"] = Field(
        default="default", description="default: every kind at fixed fractions of the run (fault_schedule.py); "
                                        "random: every kind once, in random order, targets, times and strengths, "
                                        "drawn from `seed`")
    background_noise: bool = Field(
        default=True, description="what healthy fleets show and detectors must not call a fault: slow temperature "
                                  "swings, software power-cap episodes, correctable ECC counts")

    @field_validator("nodes")
    @classmethod
    def _enough_nodes(cls, v: int) -> int:
        return check_nodes(v)

    @property
    def ranks(self) -> int:
        return self.nodes * self.gpus_per_node


def check_nodes(n: int) -> int:
    """`n` if it is a fleet size the simulator supports, else a ValueError saying why."""
    if n < 2:
        raise ValueError(f"the fleet simulator needs at least 2 nodes (got {n}): "
                         "the ring all-reduce, flows and clock probes all need a peer node")
    if n > MAX_NODES:
        raise ValueError(f"the fleet simulator supports at most {MAX_NODES} nodes (got {n})")
    return n
