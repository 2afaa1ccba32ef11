"""Event time per partition: waits for lagging nodes, ignores rogue clocks, forgets silent nodes."""

from __future__ import annotations

from clocktower.streams.event_clock import PartitionClock

S = 10**9
T0 = 1_780_000_000 * S


def test_time_waits_for_a_node_that_runs_behind() -> None:
    """A third of the nodes arrive 30 s late (their regrouping worker was killed): nothing expires early."""
    c = PartitionClock(tolerance_ns=60 * S)
    for n in range(6):
        c.observe(0, f"n{n}", T0)
    for n in range(4):
        c.observe(0, f"n{n}", T0 + 30 * S)
    assert c.now(0) == T0
    c.observe(0, "n4", T0 + 31 * S)
    c.observe(0, "n5", T0 + 29 * S)
    assert c.now(0) == T0 + 29 * S


def test_a_rogue_clock_an_hour_off_either_way_changes_nothing() -> None:
    c = PartitionClock(tolerance_ns=120 * S)
    for n in range(5):
        c.observe(0, f"n{n}", T0 + 10 * S)
    c.observe(0, "ahead", T0 + 3600 * S)
    c.observe(0, "behind", T0 - 3600 * S)
    assert c.now(0) == T0 + 10 * S


class _Wall:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_a_silent_node_stops_holding_time_back_after_a_minute_of_silence() -> None:
    wall = _Wall()
    c = PartitionClock(tolerance_ns=120 * S, silent_s=60, wall=wall)
    c.observe(0, "gone", T0)
    for t in (0, 30, 59):
        wall.t = t
        c.observe(0, "a", T0 + t * S)
        c.observe(0, "b", T0 + t * S)
        assert c.now(0) == T0
    wall.t = 61
    c.observe(0, "a", T0 + 61 * S)
    assert c.now(0) == T0 + 59 * S      # "gone" is forgotten; "b" (heard 2 s ago) still counts


def test_time_goes_on_when_most_nodes_of_a_partition_go_quiet() -> None:
    """Two of three nodes stop for good: after a minute of silence the third one's time is the partition's."""
    wall = _Wall()
    c = PartitionClock(silent_s=60, wall=wall)
    for t in range(0, 200, 10):
        wall.t = t
        if t < 10:
            c.observe(0, "a", T0 + t * S)
            c.observe(0, "b", T0 + t * S)
        c.observe(0, "c", T0 + t * S)
        c.now(0)
    assert c.now(0) == T0 + 190 * S


def test_partitions_keep_their_own_time_and_it_never_goes_back() -> None:
    c = PartitionClock()
    c.observe(1, "a", T0 + 5 * S)
    c.observe(2, "a", T0)
    assert (c.now(1), c.now(2), c.now(3)) == (T0 + 5 * S, T0, 0)
    c.observe(1, "late", T0)
    assert c.now(1) == T0 + 5 * S
