"""Bounds on what one request may cost the embedded engine (CLOCKTOWER_ENDPOINT_* variables).

Dashboards and the sink share one engine: a slow read must not hold the sink's
inserts (Kafka evicts a sink that stalls), and a huge body must not fill memory.
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


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
    query_log_flush_ms: int = Field(
        default=7500, ge=100, description="how soon queries appear in system.query_log (ClickHouse's default)"
    )
    header_timeout_s: float = Field(
        default=5.0, gt=0, description="request line and headers must arrive within this of the first byte, else closed"
    )

    def timeout_for(self, kind: str) -> float:
        """The max_execution_time cap of a statement kind (insert, write or read)."""
        return self.read_timeout_s if kind == "read" else self.write_timeout_s
