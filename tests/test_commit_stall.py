"""The stream worker's check for partitions whose handled records stay uncommitted (streams/commit_stall.py)."""

from __future__ import annotations

from clocktower.streams.commit_stall import CommitStall


def test_read_ahead_of_the_commit_with_neither_moving_for_the_limit_is_a_stall() -> None:
    s = CommitStall(stall_s=60)
    assert s.check({"gpu-0": (143, None)}, now=0) == []
    assert s.check({"gpu-0": (143, None)}, now=59) == []
    assert s.check({"gpu-0": (143, None)}, now=60) == ["gpu-0"]


def test_a_commit_or_a_new_record_starts_the_wait_again() -> None:
    s = CommitStall(stall_s=60)
    s.check({"p": (10, 5)}, now=0)
    assert s.check({"p": (12, 5)}, now=50) == []            # still reading
    assert s.check({"p": (12, 8)}, now=100) == []           # committing
    assert s.check({"p": (12, 8)}, now=159) == []
    assert s.check({"p": (12, 8)}, now=160) == ["p"]


def test_nothing_read_or_everything_committed_is_never_a_stall() -> None:
    s = CommitStall(stall_s=60)
    for now in (0, 100, 1000):
        assert s.check({"idle": (None, None), "done": (99, 100), "resumed": (None, 40)}, now=now) == []


def test_a_partition_no_longer_assigned_is_forgotten() -> None:
    s = CommitStall(stall_s=60)
    s.check({"p": (10, None)}, now=0)
    s.check({}, now=30)
    assert s.check({"p": (10, None)}, now=70) == []         # assigned again: the wait starts again
