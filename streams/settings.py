"""The stream worker's settings (CLOCKTOWER_* variables); clocktower/config.py composes them with the others."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from clocktower.runtime.settings import RuntimeSettings


class StreamsSettings(RuntimeSettings):
    streams_instance_id: str | None = Field(default=None, description="static member id; unique per worker")
    clock_pure_tolerance_ns: float = Field(
        default=2_000.0, gt=0, description="a probe pair is pure when its arrival spacing is within this of its send "
        "spacing: 2000 suits kernel software timestamps, ~100 hardware (NIC) timestamps")
    clock_update_ms: float = Field(default=250.0, gt=0, description="probe time between clock estimates")
    remediation_max_per_hour: int = Field(
        default=2, ge=0, description="node replacements (drain + spare) the streams may order per hour of the "
        "worker's own clock (never event time, which producers write) without a human; more are reported as incidents "
        "that need approval. Per stream worker.")
    streams_metrics_port: int = Field(default=0, ge=0, le=65535, description="Prometheus endpoint of the stream "
                                      "worker (its own port: the sink's CLOCKTOWER_METRICS_PORT may be on the same "
                                      "host); 0 disables it. Binds CLOCKTOWER_METRICS_HOST.")
    streams_idle_fetch_backoff_ms: int = Field(
        default=250, ge=0, le=5000, description="after a fetch that brought no records, wait this long before the "
        "next fetch to that broker (the embedded broker answers empty fetches at once, so an idle worker would spin); "
        "the most an idle worker adds to a record's latency. 0 disables it.")
    streams_segment_ttl_s: float = Field(
        default=10.0, gt=0, description="event time a half-joined flow segment waits for its other half before it "
        "expires (counted in clocktower_streams_state_expired_total)")
    streams_log_level: Literal["debug", "info", "warn", "error"] = Field(
        default="warn", description="the stream worker's log level (info shows rebalances and table recovery)")
