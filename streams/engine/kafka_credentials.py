"""The streams' Kafka login: CLOCKTOWER_KAFKA_* (schemas/kafka_security.py) as Faust broker credentials."""

from __future__ import annotations

from faust.auth import SASLCredentials, SSLCredentials
from faust.types.auth import CredentialsT

from clocktower.schemas.kafka_security import KafkaSecurity


def faust_credentials(sec: KafkaSecurity) -> CredentialsT | None:
    """SASL (over TLS when the protocol says so) or mTLS credentials; None for PLAINTEXT."""
    if sec.sasl:
        return SASLCredentials(username=sec.sasl_username,
                               password=sec.sasl_password.get_secret_value() if sec.sasl_password else None,
                               mechanism=sec.sasl_mechanism, ssl_context=sec.ssl_context())
    if sec.tls:
        return SSLCredentials(sec.ssl_context())
    return None
