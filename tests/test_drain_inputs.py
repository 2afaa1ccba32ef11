"""The drain check and `topics` lag read the streams' inputs from the one list the Faust app uses."""

from __future__ import annotations

import pytest

from clocktower import drain, topic_admin
from clocktower.streams.inputs import INPUT_TOPICS


def test_drain_waits_for_the_streams_on_every_input_topic_including_clock_probes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [{"topic": "telemetry.clock", "partition": 0, "end": 10, "clocktower-sink": 10, "clocktower-streams": 4},
            {"topic": "analytics.flows", "partition": 0, "end": 5, "clocktower-sink": 5, "clocktower-streams": 0}]
    monkeypatch.setattr(drain, "topic_offsets", lambda bootstrap: rows)
    assert drain.lag("unused:1") == 6            # the streams' 6 unread probes; analytics.* is not theirs
    assert drain.lag("unused:1", with_streams=False) == 0


def test_topics_lag_lists_the_streams_inputs_from_the_same_list() -> None:
    assert tuple(topic_admin.READERS["clocktower-streams"]) == INPUT_TOPICS
    assert set(INPUT_TOPICS) <= set(topic_admin.READERS["clocktower-sink"])
