"""The stream worker's check for partitions fetched but left uncommitted (streams/commit_stall.py)."""

from __future__ import annotations

from clocktower.streams.commit_stall import CommitStall


def test_a_position_ahead_of_the_commit_with_no_offset_moving_for_the_limit_is_a_stall() -> None:
    s = CommitStall(stall_checks=3)
    assert s.check({"links-0": (78, 0), "gpu-1": (143, 100)}) == []
    assert s.check({"links-0": (78, 0), "gpu-1": (143, 100)}) == []
    assert s.check({"links-0": (78, 0), "gpu-1": (143, 100)}) == ["links-0", "gpu-1"]


def test_a_commit_or_a_new_record_starts_the_count_again() -> None:
    s = CommitStall(stall_checks=3)
    s.check({"p": (10, 5)})
    s.check({"p": (10, 5)})
    assert s.check({"p": (12, 5)}) == []              # still reading
    assert s.check({"p": (12, 8)}) == []              # committing
    assert s.check({"p": (12, 8)}) == []
    assert s.check({"p": (12, 8)}) == ["p"]


def test_caught_up_rewound_or_without_a_position_is_never_a_stall() -> None:
    """Everything committed (the position is the commit), rewound behind the commit, or an offset reset pending."""
    s = CommitStall(stall_checks=3)
    for _ in range(10):
        assert s.check({"done": (40, 40), "rewound": (30, 40), "resetting": (None, 7), "unknown": (5, None)}) == []


def test_a_partition_no_longer_ahead_or_assigned_is_forgotten() -> None:
    s = CommitStall(stall_checks=3)
    s.check({"p": (10, 0)})
    s.check({"p": (10, 0)})
    s.check({})
    assert s.check({"p": (10, 0)}) == []              # the count starts again
