"""The drain check and `topics` lag read the streams' inputs from the registry the Faust app is built from."""

from __future__ import annotations

import pytest

from clocktower import drain, topic_admin
from clocktower.streams.registry import PROCESSORS, input_topics, repartition_topic, repartitions


def test_drain_waits_for_the_streams_on_every_input_topic_including_clock_probes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    lags = {("clocktower-sink", "telemetry.clock"): 0, ("clocktower-streams", "telemetry.clock"): 6,
            ("clocktower-sink", "analytics.flows"): 0, ("clocktower-streams", "analytics.flows"): 5}

    def consumer_lag(bootstrap: str, readers: dict[str, tuple[str, ...]]) -> list[dict]:
        return [{"group": g, "topic": t, "partition": 0, "lag": n} for (g, t), n in lags.items()
                if t in readers.get(g, ())]

    monkeypatch.setattr(drain, "consumer_lag", consumer_lag)
    assert drain.lag("unused:1") == 6            # the streams' 6 unread probes; analytics.* is not theirs
    assert drain.lag("unused:1", with_streams=False) == 0


def test_topics_lag_lists_the_streams_inputs_from_the_same_list() -> None:
    streams = topic_admin.READERS["clocktower-streams"]
    regrouped = [repartition_topic(c) for c in PROCESSORS if repartitions(c)]
    assert regrouped, "the flow join, iteration breakdown and clock edge fits are regrouped"
    assert tuple(streams) == input_topics() + tuple(regrouped)
    assert set(input_topics()) <= set(topic_admin.READERS["clocktower-sink"])
    assert {"telemetry.clock", "telemetry.flows", "analytics.clock_edges"} <= set(input_topics())


def test_drain_waits_for_a_repartition_topic(monkeypatch: pytest.MonkeyPatch) -> None:
    """A segment still in the flow join's repartition topic is work the streams have yet to do."""
    regrouped = repartition_topic(PROCESSORS[0])

    def consumer_lag(bootstrap: str, readers: dict[str, tuple[str, ...]]) -> list[dict]:
        return [{"group": g, "topic": regrouped, "partition": 3, "lag": 4} for g in readers if regrouped in readers[g]]

    monkeypatch.setattr(drain, "consumer_lag", consumer_lag)
    assert drain.lag("unused:1") == 4
