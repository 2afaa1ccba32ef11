"""clocktower's configuration, from CLOCKTOWER_* environment variables (pydantic-settings).

The CLI composes the services' own settings models (each runnable alone with the same variables):
the shared data-dir/Kafka/ClickHouse ones (runtime/settings.py), the stream worker's (streams/settings.py)
and the sink's (sinks/clickhouse/settings.py), and adds what only `clocktower up` reads.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator

from clocktower.sinks.clickhouse.settings import SinkSettings
from clocktower.streams.settings import StreamsSettings


class Settings(StreamsSettings, SinkSettings):
    streams_workers: int = Field(default=1, ge=1, le=64, description="stream workers `clocktower up` and `demo` "
                                 "run, each with its own static member id (`<CLOCKTOWER_STREAMS_INSTANCE_ID or "
                                 "clocktower-streams-HOST>-N` from the second on); they share the streams' partitions")
    http_max_connections: int = Field(default=32, ge=1, description="concurrent connections the embedded "
                                      "ClickHouse endpoint serves; more wait briefly, then get 503")
    log_trim_s: float = Field(default=10.0, ge=0, description="with the embedded broker: how often `up` and `demo` "
                              "delete the records every reader has committed (clocktower/log_trim.py); 0 = never")
    log_keep_s: float = Field(default=30.0, ge=1, description="with the embedded broker: the newest seconds of "
                              "every partition that are never deleted, committed or not (by the stack's clock)")

    @field_validator("log_trim_s")
    @classmethod
    def _trim_period(cls, v: float) -> float:
        if 0 < v < 1:
            raise ValueError("CLOCKTOWER_LOG_TRIM_S is 0 (never delete) or at least 1 s (each pass queries the broker)")
        return v
    noida_bin: Path | None = Field(default=None, description="the noida-db executable of the embedded broker "
                                   "(default: the one installed with the noida-db package, else PATH)")
