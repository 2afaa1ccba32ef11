"""CLOCKTOWER_KAFKA_* (SASL/SCRAM, mTLS) reach every Kafka client: librdkafka and Faust/aiokafka.

noida-db (the embedded broker) has no option to configure Kafka users or TLS, so these
tests check the mappings and that each client library accepts them, not a login.
"""

from __future__ import annotations

import ssl
import subprocess
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth
from pydantic import ValidationError

from clocktower.schemas.kafka_security import KafkaSecurity
from clocktower.streams.engine.kafka_credentials import faust_credentials


def _pem_pair(tmp: Path, name: str) -> tuple[Path, Path]:
    """A self-signed certificate and its key, PEM files in `tmp` (openssl CLI)."""
    cert_path, key_path = tmp / f"{name}.crt", tmp / f"{name}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-days", "1", "-subj", f"/CN={name}", "-keyout", str(key_path), "-out", str(cert_path)],
                   check=True, capture_output=True, timeout=30)
    return cert_path, key_path


def test_plaintext_default_adds_nothing(monkeypatch) -> None:
    monkeypatch.delenv("CLOCKTOWER_KAFKA_SECURITY_PROTOCOL", raising=False)
    sec = KafkaSecurity()
    assert sec.librdkafka() == {} and faust_credentials(sec) is None


def test_scram_over_tls_from_the_environment(monkeypatch, tmp_path) -> None:
    ca, _ = _pem_pair(tmp_path, "ca")
    monkeypatch.setenv("CLOCKTOWER_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("CLOCKTOWER_KAFKA_SASL_MECHANISM", "SCRAM-SHA-256")
    monkeypatch.setenv("CLOCKTOWER_KAFKA_SASL_USERNAME", "node-7")
    monkeypatch.setenv("CLOCKTOWER_KAFKA_SASL_PASSWORD", "s3cret")
    monkeypatch.setenv("CLOCKTOWER_KAFKA_SSL_CA_FILE", str(ca))
    monkeypatch.setenv("CLOCKTOWER_KAFKA_BOOTSTRAP", "kafka:9093")   # clocktower/config.py's, ignored here
    sec = KafkaSecurity()
    conf = sec.librdkafka()
    assert conf == {"security.protocol": "sasl_ssl", "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": "node-7",
                    "sasl.password": "s3cret", "ssl.endpoint.identification.algorithm": "https",
                    "ssl.ca.location": str(ca)}
    assert "s3cret" not in repr(sec)
    # librdkafka accepts every key (it raises on unknown or invalid ones); nothing connects yet.
    Producer({"bootstrap.servers": "127.0.0.1:1", **conf})
    Consumer({"bootstrap.servers": "127.0.0.1:1", "group.id": "g", **conf}).close()
    auth = credentials_to_aiokafka_auth(faust_credentials(sec))
    assert auth["security_protocol"] == "SASL_SSL" and auth["sasl_mechanism"] == "SCRAM-SHA-256"
    assert auth["sasl_plain_username"] == "node-7" and auth["sasl_plain_password"] == "s3cret"
    assert isinstance(auth["ssl_context"], ssl.SSLContext) and auth["ssl_context"].check_hostname


def test_mtls_client_certificate(tmp_path) -> None:
    ca, _ = _pem_pair(tmp_path, "ca")
    cert, key = _pem_pair(tmp_path, "node-7")
    sec = KafkaSecurity(security_protocol="SSL", ssl_ca_file=ca, ssl_cert_file=cert, ssl_key_file=key)
    conf = sec.librdkafka()
    assert conf["security.protocol"] == "ssl" and "sasl.mechanism" not in conf
    assert conf["ssl.certificate.location"] == str(cert) and conf["ssl.key.location"] == str(key)
    Producer({"bootstrap.servers": "127.0.0.1:1", **conf})
    auth = credentials_to_aiokafka_auth(faust_credentials(sec))
    assert auth["security_protocol"] == "SSL" and auth["ssl_context"].verify_mode == ssl.CERT_REQUIRED


@pytest.mark.parametrize("bad", [
    {"security_protocol": "SASL_SSL"},                                          # no login
    {"security_protocol": "SASL_SSL", "sasl_username": "u"},                    # no password
    {"security_protocol": "SSL", "ssl_cert_file": "/c.pem"},                    # cert without key
    {"security_protocol": "PLAINTEXT", "ssl_ca_file": "/ca.pem"},               # TLS file, no TLS
    {"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN", "sasl_username": "u", "sasl_password": "p"},
])
def test_inconsistent_settings_are_refused(bad) -> None:
    with pytest.raises(ValidationError):
        KafkaSecurity(**bad)


def test_every_client_takes_the_login(monkeypatch) -> None:
    """The publisher, the sink and topic admin build their clients with the login (a wrong key would raise)."""
    from clocktower import topic_admin
    from clocktower.producers.kafka_publisher import KafkaPublisher
    from clocktower.sinks.clickhouse import kafka_sink

    seen: list[dict] = []

    def spy(cls):  # noqa: ANN001, ANN202
        def make(conf, *a, **kw):  # noqa: ANN001, ANN202
            seen.append(conf)
            raise RuntimeError("stop")
        return make

    sec = KafkaSecurity(security_protocol="SASL_PLAINTEXT", sasl_username="u", sasl_password="p")
    from clocktower.runtime import consumer_lag as lag_module

    for module, names in ((kafka_sink, ("Consumer", "Producer")), (topic_admin, ("AdminClient",)),
                          (lag_module, ("Consumer",))):
        for n in names:
            monkeypatch.setattr(module, n, spy(n))
    import clocktower.producers.kafka_publisher as kp
    monkeypatch.setattr(kp, "Producer", spy("Producer"))
    for call in (lambda: KafkaPublisher("h:1", security=sec),
                 lambda: kafka_sink.KafkaClickHouseSink("h:1", None, security=sec),
                 lambda: topic_admin.ensure_topics("h:1", security=sec),
                 lambda: topic_admin.consumer_lag("h:1", security=sec)):
        with pytest.raises(RuntimeError, match="stop"):
            call()
    assert len(seen) == 4 and all(c["security.protocol"] == "sasl_plaintext" and c["sasl.username"] == "u"
                                  for c in seen)
