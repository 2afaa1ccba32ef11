"""The demo summary's figures are read between two equal row counts, so they agree with each other."""

from __future__ import annotations

from clocktower.summary import settled


def test_what_is_derived_between_two_equal_counts_is_returned_with_them() -> None:
    counts = iter([{"flow_latency": 10}, {"flow_latency": 12}, {"flow_latency": 12}])
    derived = iter(["first", "second"])
    rows, result, steady = settled(lambda: next(counts), lambda: next(derived), pause_s=0)
    assert (rows, result, steady) == ({"flow_latency": 12}, "second", True)


def test_counts_that_never_settle_are_said() -> None:
    n = iter(range(100))
    rows, result, steady = settled(lambda: {"flow_latency": next(n)}, lambda: "x", tries=3, pause_s=0)
    assert not steady and rows == {"flow_latency": 3} and result == "x"
