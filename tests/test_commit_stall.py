"""The stream worker's check for partitions whose records stay unhandled or uncommitted (streams/commit_stall.py)."""

from __future__ import annotations

from clocktower.streams.commit_stall import CommitStall


def test_pending_work_with_no_offset_moving_for_the_limit_is_a_stall() -> None:
    s = CommitStall(stall_checks=3)
    assert s.check({"gpu-0": (143, None, True)}) == []
    assert s.check({"gpu-0": (143, None, True)}) == []
    assert s.check({"gpu-0": (143, None, True)}) == ["gpu-0"]


def test_a_commit_or_a_new_record_starts_the_count_again() -> None:
    s = CommitStall(stall_checks=3)
    s.check({"p": (10, 5, True)})
    s.check({"p": (10, 5, True)})
    assert s.check({"p": (12, 5, True)}) == []              # still reading
    assert s.check({"p": (12, 8, True)}) == []              # committing
    assert s.check({"p": (12, 8, True)}) == []
    assert s.check({"p": (12, 8, True)}) == ["p"]


def test_an_idle_partition_is_never_a_stall_whatever_its_offsets() -> None:
    """After a rebalance Faust sets the read offset to the committed one (the next to read): nothing is pending."""
    s = CommitStall(stall_checks=3)
    for _ in range(10):
        assert s.check({"seeked": (40, 40, False), "never": (None, None, False), "zero": (0, None, False),
                        "done": (99, 100, False)}) == []


def test_a_partition_no_longer_pending_or_assigned_is_forgotten() -> None:
    s = CommitStall(stall_checks=3)
    s.check({"p": (10, None, True)})
    s.check({"p": (10, None, True)})
    s.check({})
    assert s.check({"p": (10, None, True)}) == []           # the count starts again
