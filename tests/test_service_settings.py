"""Each service reads its own settings model with the same CLOCKTOWER_* names; clocktower/config.py composes them."""

from __future__ import annotations

import pytest

from clocktower.config import Settings
from clocktower.runtime.settings import RuntimeSettings
from clocktower.sinks.clickhouse.settings import SinkSettings
from clocktower.streams.settings import StreamsSettings


def test_every_field_is_defined_once() -> None:
    """A field (and its default) lives in one model of the composition, never in two."""
    owners: dict[str, list[str]] = {}
    for cls in Settings.__mro__:
        for name in vars(cls).get("__annotations__", {}):
            if name in Settings.model_fields:
                owners.setdefault(name, []).append(cls.__name__)
    assert {n: o for n, o in owners.items() if len(o) > 1} == {}
    assert set(owners) == set(Settings.model_fields)


def test_the_cli_settings_hold_every_service_setting() -> None:
    for model in (RuntimeSettings, SinkSettings, StreamsSettings):
        assert set(model.model_fields) <= set(Settings.model_fields), model.__name__


@pytest.mark.parametrize("model", [Settings, SinkSettings, StreamsSettings])
def test_services_read_the_same_variables(monkeypatch: pytest.MonkeyPatch, model: type[RuntimeSettings]) -> None:
    monkeypatch.setenv("CLOCKTOWER_KAFKA_BOOTSTRAP", "kafka:9093")
    monkeypatch.setenv("CLOCKTOWER_CLICKHOUSE_URL", "https://ch.example:8443")
    monkeypatch.setenv("CLOCKTOWER_MAX_FUTURE_SKEW_S", "5")
    monkeypatch.setenv("CLOCKTOWER_METRICS_HOST", "0.0.0.0")
    s = model()
    assert (s.bootstrap, s.clickhouse, s.max_future_skew_ns, s.metrics_host) == \
        ("kafka:9093", "https://ch.example:8443", 5_000_000_000, "0.0.0.0")


def test_sink_and_streams_settings_keep_their_own_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLOCKTOWER_FLUSH_ROWS", "7")
    monkeypatch.setenv("CLOCKTOWER_STREAMS_INSTANCE_ID", "w3")
    assert SinkSettings().flush_rows == 7 and "streams_instance_id" not in SinkSettings.model_fields
    assert StreamsSettings().streams_instance_id == "w3" and "flush_rows" not in StreamsSettings.model_fields
