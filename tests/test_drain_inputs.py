"""The drain check and `topics` lag read the streams' inputs from the one list the Faust app uses."""

from __future__ import annotations

import pytest

from clocktower import drain, topic_admin
from clocktower.streams.inputs import INPUT_TOPICS


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
    assert tuple(topic_admin.READERS["clocktower-streams"]) == INPUT_TOPICS
    assert set(INPUT_TOPICS) <= set(topic_admin.READERS["clocktower-sink"])
