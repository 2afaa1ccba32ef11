"""The settings every service shares (CLOCKTOWER_* variables): where the data dir, Kafka and ClickHouse are.

Each service's own model (streams/settings.py, sinks/clickhouse/settings.py) extends this one, and
clocktower/config.py composes them all: each field's name and default is defined once, here or in the one
service that reads it. With neither CLOCKTOWER_KAFKA_BOOTSTRAP nor CLOCKTOWER_CLICKHOUSE_URL set, `clocktower up`
starts its embedded broker and ClickHouse engine under the data dir; setting them points every component at
external services instead.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from clocktower.runtime.broker_profile import BrokerProfile, ProfileSettings, profile_field, profile_settings
from clocktower.runtime.credentials import admin_login, control_key_path, read_control_key
from clocktower.runtime.errors import UserError
from clocktower.runtime.owner_note import read_owner
from clocktower.runtime.private_file import read_private_file
from clocktower.schemas.envelope_checks import DEFAULT_MAX_FUTURE_SKEW_S


class RuntimeSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CLOCKTOWER_", extra="ignore")

    data_dir: Path = Path(".clocktower")
    kafka_bootstrap: str | None = Field(default=None, description="external Kafka, host:port[,host:port]")
    clickhouse_url: str | None = Field(default=None, description="external ClickHouse, http(s)://host:port")
    clickhouse_user: str | None = Field(default=None, description="default: the data dir's generated user")
    clickhouse_password: str | None = Field(default=None, description="default: the data dir's generated one")
    clickhouse_database: str = "default"
    kafka_port: int = Field(default=9092, ge=1, le=65535)
    http_port: int = Field(default=8123, ge=1, le=65535)
    host: str = "127.0.0.1"
    control_private_key_file: Path | None = Field(default=None, description=(
        "Ed25519 private key (PEM, 0600) that signs control commands; default with the embedded broker: the one "
        "`clocktower up` generates in the data dir. With an external Kafka it must be set"))
    control_key: str | None = Field(default=None, description="no longer used (it was an HMAC key)")
    metrics_host: str = Field(default="127.0.0.1", description="where the Prometheus endpoints bind; 0.0.0.0 "
                              "only inside a container whose port is not published")
    broker_profile: BrokerProfile = profile_field()
    max_future_skew_s: float = Field(default=DEFAULT_MAX_FUTURE_SKEW_S, gt=0, description="the sink and the streams "
                                     "dead-letter a record with an event stamped more than this ahead of their clock")

    @field_validator("control_key")
    @classmethod
    def _no_hmac_key(cls, v: str | None) -> str | None:
        if v:
            raise ValueError("CLOCKTOWER_CONTROL_KEY (a shared HMAC key) is no longer used: commands are signed with "
                             "Ed25519. Unset it, and set CLOCKTOWER_CONTROL_PRIVATE_KEY_FILE on the streams "
                             "(`clocktower control keygen DIR` makes a pair)")
        return v

    @field_validator("clickhouse_url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is None:
            return v
        u = urlparse(v)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"CLOCKTOWER_CLICKHOUSE_URL must look like http://host:8123, got {v!r}")
        return v

    @property
    def workarounds(self) -> ProfileSettings:
        """What the embedded broker's workarounds run with under `broker_profile`."""
        return profile_settings(self.broker_profile)

    @property
    def max_future_skew_ns(self) -> int:
        return round(self.max_future_skew_s * 1e9)

    @property
    def embedded_kafka(self) -> bool:
        return not self.kafka_bootstrap

    @property
    def embedded_clickhouse(self) -> bool:
        return not self.clickhouse_url

    @property
    def bootstrap(self) -> str:
        return self.kafka_bootstrap or f"{self.host}:{self.kafka_port}"

    @property
    def clickhouse(self) -> str:
        return self.clickhouse_url or f"http://{self.host}:{self.http_port}"

    def clickhouse_login(self) -> tuple[str, str]:
        """(user, password): CLOCKTOWER_CLICKHOUSE_USER/_PASSWORD if set, else, for the data dir's own endpoint,
        its generated login. An external ClickHouse never gets the generated one."""
        if self.clickhouse_user is None and self.clickhouse_password is None and self._own_endpoint():
            generated = admin_login(self.data_dir)
            if generated is not None:
                return generated
        return self.clickhouse_user or "default", self.clickhouse_password or ""

    def _own_endpoint(self) -> bool:
        """The embedded endpoint: ours to start, or the one the data dir's running owner serves."""
        if self.embedded_clickhouse:
            return True
        owner = read_owner(self.data_dir)
        return owner is not None and owner.get("clickhouse_embedded") is True and \
            owner.get("clickhouse") == self.clickhouse_url

    def control_private_key_pem(self) -> tuple[bytes, Path]:
        """(PEM bytes, their file) of the signing key: CLOCKTOWER_CONTROL_PRIVATE_KEY_FILE, else, with the embedded
        broker, the data dir's generated one. There is no built-in key, and an external cluster never gets the data
        dir's: it needs one configured."""
        if self.control_private_key_file is not None:
            return read_private_file(self.control_private_key_file), self.control_private_key_file
        path = control_key_path(self.data_dir)
        if not self.embedded_kafka:
            raise UserError("no control signing key: with an external Kafka set CLOCKTOWER_CONTROL_PRIVATE_KEY_FILE "
                            "(`clocktower control keygen DIR` makes a key pair)")
        key = read_control_key(self.data_dir)
        if key is None:
            raise UserError(f"no control signing key: run `clocktower up` once to generate {path}, or set "
                            "CLOCKTOWER_CONTROL_PRIVATE_KEY_FILE")
        return key, path
