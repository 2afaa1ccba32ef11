"""The stream worker's check for partitions fetched but left uncommitted (streams/commit_stall.py)."""

from __future__ import annotations

from clocktower.streams.commit_stall import CommitStall


def test_a_position_ahead_of_the_commit_with_no_offset_moving_for_the_limit_is_a_stall() -> None:
    s = CommitStall(stall_checks=3)
    assert s.check({"links-0": (78, 0, None), "gpu-1": (143, 100, 99)}) == []
    assert s.check({"links-0": (78, 0, None), "gpu-1": (143, 100, 99)}) == []
    assert s.check({"links-0": (78, 0, None), "gpu-1": (143, 100, 99)}) == ["links-0", "gpu-1"]


def test_a_commit_a_new_record_or_one_processed_starts_the_count_again() -> None:
    s = CommitStall(stall_checks=3)
    s.check({"p": (10, 5, None)})
    s.check({"p": (10, 5, None)})
    assert s.check({"p": (12, 5, None)}) == []           # still reading
    assert s.check({"p": (12, 8, None)}) == []           # committing
    assert s.check({"p": (12, 8, 4)}) == []              # processing (an agent slow to send its outputs)
    assert s.check({"p": (12, 8, 4)}) == []
    assert s.check({"p": (12, 8, 4)}) == ["p"]


def test_records_processed_but_never_committed_are_a_stall_sooner() -> None:
    """Their outputs are sent and they are acked at once: a commit that does not come is Faust's bookkeeping stuck
    (seen in a loaded kill-test run), not a slow agent."""
    s = CommitStall(stall_checks=30, processed_stall_checks=3)
    for _ in range(2):
        assert s.check({"stuck": (1297, 435, 1296), "slow": (50, 40, 39)}) == []
    assert s.counting() == {"stuck": ((1297, 435, 1296), 2), "slow": ((50, 40, 39), 2)}   # what the worker logs
    assert s.check({"stuck": (1297, 435, 1296), "slow": (50, 40, 39)}) == ["stuck"]


def test_caught_up_rewound_or_without_a_position_is_never_a_stall() -> None:
    """Everything committed (the position is the commit), rewound behind the commit, or an offset reset pending."""
    s = CommitStall(stall_checks=3, processed_stall_checks=1)
    for _ in range(10):
        assert s.check({"done": (40, 40, 39), "rewound": (30, 40, 39), "resetting": (None, 7, 6),
                        "unknown": (5, None, 4)}) == []


def test_a_partition_no_longer_ahead_or_assigned_is_forgotten() -> None:
    s = CommitStall(stall_checks=3)
    s.check({"p": (10, 0, None)})
    s.check({"p": (10, 0, None)})
    s.check({})
    assert s.check({"p": (10, 0, None)}) == []           # the count starts again
