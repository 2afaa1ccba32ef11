"""Bounds on what one request may cost the embedded engine (CLOCKTOWER_ENDPOINT_* variables).

Dashboards and the sink share one engine: a slow read must not hold the sink's
inserts (Kafka evicts a sink that stalls), and a huge body must not fill memory.
"""

from __future__ import annotations

import os

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


def _default_threads() -> int:
    """A quarter of the cores (at least 1): a dashboard's dozen panels must not each take every core."""
    return max(1, (os.cpu_count() or 1) // 4)


class EndpointLimits(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CLOCKTOWER_ENDPOINT_", extra="ignore")

    read_timeout_s: float = Field(default=60.0, gt=0, description="max_execution_time of reads; clients may lower it")
    write_timeout_s: float = Field(
        default=600.0, gt=0, description="max_execution_time of inserts, DDL and mutations; clients may lower it"
    )
    max_query_bytes: int = Field(default=1 << 20, ge=1024, description="query text (URL + body), else 413")
    max_insert_bytes: int = Field(default=256 << 20, ge=1024, description="decoded INSERT data per request, else 413")
    insert_head_bytes: int = Field(
        default=64 << 10, ge=1024, description="INSERT ... FORMAT name / VALUES must appear within this many bytes"
    )
    # Sessions are how many requests of a kind run at once (a session runs one query at a time); they are cheap
    # (about 25 ms to open, no memory to speak of), and a Grafana dashboard sends a dozen panel queries together.
    write_sessions: int = Field(
        default=12, ge=2, description="engine sessions for POSTs of writers; one of them only ever runs inserts"
    )
    get_sessions: int = Field(default=12, ge=1, description="engine sessions for GETs (readonly=2)")
    reader_sessions: int = Field(default=12, ge=1, description="engine sessions for the read-only role (readonly=1)")
    queue_timeout_s: float = Field(
        default=30.0, gt=0, description="how long a request waits for a free session, else 503"
    )
    # Up to write_sessions + get_sessions + reader_sessions queries run at once: each gets these as its baseline.
    max_threads: int = Field(
        default_factory=_default_threads,
        ge=1,
        description="max_threads of every engine session (default: a quarter of the cores)",
    )
    max_memory_usage: int = Field(
        default=2 << 30, ge=0, description="max_memory_usage of every engine session, bytes per query (0: no limit)"
    )
    query_log_flush_ms: int = Field(
        default=7500, ge=100, description="how soon queries appear in system.query_log (ClickHouse's default)"
    )
    header_timeout_s: float = Field(
        default=5.0, gt=0, description="request line and headers must arrive within this of the first byte, else closed"
    )

    def session_baseline(self) -> dict[str, str]:
        """Settings every engine session starts with, besides its time cap."""
        return {"max_threads": str(self.max_threads), "max_memory_usage": str(self.max_memory_usage)}

    def ceilings(self) -> dict[str, int]:
        """Settings clients may lower but not raise (0: no ceiling)."""
        return {"max_threads": self.max_threads, "max_memory_usage": self.max_memory_usage}

    def timeout_for(self, kind: str) -> float:
        """The max_execution_time cap of a statement kind (insert, write or read)."""
        return self.read_timeout_s if kind == "read" else self.write_timeout_s
