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
        return [{"group": g, "topic": t, "partition": 0, "lag": n, "committed": None} for (g, t), n in lags.items()
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
        return [{"group": g, "topic": regrouped, "partition": 3, "lag": 4, "committed": 9}
                for g in readers if regrouped in readers[g]]

    monkeypatch.setattr(drain, "consumer_lag", consumer_lag)
    assert drain.lag("unused:1") == 4


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


def _polls(monkeypatch: pytest.MonkeyPatch, readings: list[tuple[int, int | None]]) -> _Clock:
    """drain.wait_drained over `readings` (lag, committed offset), one per poll, then the last one for ever."""
    clock = _Clock()
    monkeypatch.setattr(drain, "time", clock)

    def consumer_lag(bootstrap: str, readers: dict[str, tuple[str, ...]]) -> list[dict]:
        n, committed = readings.pop(0) if len(readings) > 1 else readings[0]
        return [{"group": "clocktower-sink", "topic": "t", "partition": 0, "lag": n, "committed": committed}]

    monkeypatch.setattr(drain, "consumer_lag", consumer_lag)
    return clock


def test_a_slow_drain_is_waited_for_as_long_as_the_consumers_commit(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _polls(monkeypatch, [(1000 - i, i) for i in range(0, 1000, 5)] + [(0, 1000)])
    assert drain.wait_drained("unused:1", None, stall_s=10.0)
    assert clock.now > 60                      # far past the stall limit: what counts is progress


def test_a_drain_is_given_up_once_nothing_is_committed_for_the_stall_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _polls(monkeypatch, [(500, None), (400, 100), (300, 200), (300, 200)])
    assert not drain.wait_drained("unused:1", None, stall_s=10.0)
    assert 10.0 <= clock.now <= 12.0           # the last commit came at 1 s


def test_with_the_streams_drained_means_no_lag_for_the_clock_wait_and_a_second_more(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A flow segment held for its clock estimates comes out up to CLOCKTOWER_STREAMS_CLOCK_WAIT_S after its input
    was read: two polls at lag 0 are not enough; lag coming back (the held rows reach the sink) starts it again."""
    clock = _polls(monkeypatch, [(0, 10), (0, 10), (5, 10), *[(0, 15)] * 20])
    assert drain.wait_drained("unused:1", None)
    assert clock.now >= 2 + 4.0 and drain.streams_settle_s() == 4.0   # from the poll after the lag came back
    monkeypatch.setenv("CLOCKTOWER_STREAMS_CLOCK_WAIT_S", "9")        # as configured
    assert drain.streams_settle_s() == 10.0
    quick = _polls(monkeypatch, [(0, 10)])
    assert drain.wait_drained("unused:1", None, with_streams=False) and quick.now <= 1.5
