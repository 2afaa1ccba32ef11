"""How every Kafka client authenticates to an external broker: SASL/SCRAM or mTLS (CLOCKTOWER_KAFKA_*).

One settings object maps to librdkafka's keys (producers, the sink, topic admin)
and to an SSL context for aiokafka (the streams). The default, PLAINTEXT with no
login, suits only the embedded broker on loopback: that one has no users or TLS.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

Protocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
Mechanism = Literal["SCRAM-SHA-256", "SCRAM-SHA-512"]


class KafkaSecurity(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CLOCKTOWER_KAFKA_", extra="ignore")

    security_protocol: Protocol = Field(default="PLAINTEXT", description="SASL_SSL for SCRAM over TLS, SSL for "
                                        "mTLS (with ssl_cert_file and ssl_key_file)")
    sasl_mechanism: Mechanism = "SCRAM-SHA-512"
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_ca_file: Path | None = Field(default=None, description="CA bundle that signed the brokers' certificates "
                                     "(default: the system's)")
    ssl_cert_file: Path | None = Field(default=None, description="client certificate (PEM) for mTLS")
    ssl_key_file: Path | None = Field(default=None, description="client private key (PEM) for mTLS")
    ssl_key_password: SecretStr | None = None

    @model_validator(mode="after")
    def _consistent(self) -> KafkaSecurity:
        if self.sasl and not (self.sasl_username and self.sasl_password):
            raise ValueError(f"{self.security_protocol} needs CLOCKTOWER_KAFKA_SASL_USERNAME and _SASL_PASSWORD")
        if (self.ssl_cert_file is None) != (self.ssl_key_file is None):
            raise ValueError("set both CLOCKTOWER_KAFKA_SSL_CERT_FILE and _SSL_KEY_FILE, or neither")
        if not self.tls and (self.ssl_ca_file or self.ssl_cert_file):
            raise ValueError(f"TLS files are set but the protocol {self.security_protocol} does not use TLS")
        return self

    @property
    def sasl(self) -> bool:
        return self.security_protocol.startswith("SASL_")

    @property
    def tls(self) -> bool:
        return self.security_protocol.endswith("SSL")

    def librdkafka(self) -> dict[str, str]:
        """confluent-kafka (librdkafka) configuration keys; empty for PLAINTEXT."""
        if self.security_protocol == "PLAINTEXT":
            return {}
        conf = {"security.protocol": self.security_protocol.lower()}
        if self.sasl:
            conf |= {"sasl.mechanism": self.sasl_mechanism, "sasl.username": str(self.sasl_username),
                     "sasl.password": self.sasl_password.get_secret_value() if self.sasl_password else ""}
        if self.tls:
            conf["ssl.endpoint.identification.algorithm"] = "https"   # check the broker's host name
            if self.ssl_ca_file:
                conf["ssl.ca.location"] = str(self.ssl_ca_file)
            if self.ssl_cert_file and self.ssl_key_file:
                conf |= {"ssl.certificate.location": str(self.ssl_cert_file),
                         "ssl.key.location": str(self.ssl_key_file)}
                if self.ssl_key_password:
                    conf["ssl.key.password"] = self.ssl_key_password.get_secret_value()
        return conf

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context for aiokafka (host names checked, client certificate loaded for mTLS)."""
        if not self.tls:
            return None
        ctx = ssl.create_default_context(cafile=str(self.ssl_ca_file) if self.ssl_ca_file else None)
        if self.ssl_cert_file and self.ssl_key_file:
            ctx.load_cert_chain(self.ssl_cert_file, self.ssl_key_file,
                                self.ssl_key_password.get_secret_value() if self.ssl_key_password else None)
        return ctx
