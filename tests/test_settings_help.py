"""The services' --help lists the variables their settings models read, from the models themselves."""

from __future__ import annotations

from clocktower.runtime.settings_help import variables
from clocktower.sinks.clickhouse.settings import SinkSettings
from clocktower.streams.settings import StreamsSettings


def test_every_field_is_listed_under_the_name_the_environment_uses() -> None:
    for model in (SinkSettings, StreamsSettings):
        listed = dict(variables(model))
        assert len(listed) == len(model.model_fields)
        assert all(name.startswith("CLOCKTOWER_") for name in listed)
    sink = dict(variables(SinkSettings))
    assert "CLOCKTOWER_BROKER_PROFILE" in sink and "external Kafka" in sink["CLOCKTOWER_KAFKA_BOOTSTRAP"]
    assert "default" in sink["CLOCKTOWER_FLUSH_ROWS"]
    assert "(default" not in sink["CLOCKTOWER_CLICKHOUSE_PASSWORD"]   # no value of a secret: none is built in
