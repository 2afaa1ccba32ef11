"""The stream worker's check for partitions read but left uncommitted (streams/commit_stall.py)."""

from __future__ import annotations

from clocktower.streams.commit_stall import CommitStall


def test_read_ahead_of_the_commit_with_no_offset_moving_for_the_limit_is_a_stall() -> None:
    s = CommitStall(stall_checks=3)
    assert s.check({"gpu-0": (143, None), "gpu-1": (143, 100)}) == []
    assert s.check({"gpu-0": (143, None), "gpu-1": (143, 100)}) == []
    assert s.check({"gpu-0": (143, None), "gpu-1": (143, 100)}) == ["gpu-0", "gpu-1"]


def test_a_commit_or_a_new_record_starts_the_count_again() -> None:
    s = CommitStall(stall_checks=3)
    s.check({"p": (10, 5)})
    s.check({"p": (10, 5)})
    assert s.check({"p": (12, 5)}) == []              # still reading
    assert s.check({"p": (12, 8)}) == []              # committing
    assert s.check({"p": (12, 8)}) == []
    assert s.check({"p": (12, 8)}) == ["p"]


def test_what_faust_sets_after_a_rebalance_and_everything_committed_are_never_a_stall() -> None:
    """After a rebalance Faust sets the read offset to the committed one (the next to read), and keeps a committed
    0 as None with read 0: an idle partition must never end the worker."""
    s = CommitStall(stall_checks=3)
    for _ in range(10):
        assert s.check({"seeked": (40, 40), "zero": (0, None), "never": (None, None), "done": (99, 100)}) == []


def test_a_partition_no_longer_read_ahead_or_assigned_is_forgotten() -> None:
    s = CommitStall(stall_checks=3)
    s.check({"p": (10, None)})
    s.check({"p": (10, None)})
    s.check({})
    assert s.check({"p": (10, None)}) == []           # the count starts again
