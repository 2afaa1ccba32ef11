"""AckHold: acked records kept for hold_s, bounded by bytes, handed back oldest first."""

from __future__ import annotations

from clocktower.producers.ack_hold import AckHold
from clocktower.producers.spool import SpoolRecord


def _rec(seq: int, size: int = 10) -> SpoolRecord:
    return SpoolRecord(seq, "telemetry.gpu", b"n", b"x" * size, [("ct-rid", b"r%d" % seq)], 1_700_000_000_000 + seq)


def test_records_are_held_for_hold_s_then_let_go() -> None:
    hold = AckHold(5.0)
    for i in range(3):
        hold.hold(_rec(i), now=100.0 + i)
    hold.release(104.9)
    assert len(hold) == 3
    hold.release(105.0)                                  # the first was acked at 100: 5 s are up
    assert len(hold) == 2
    assert [r.seq for r in hold.take_all()] == [1, 2]
    assert len(hold) == 0


def test_the_hold_is_bounded_by_bytes_oldest_go_first() -> None:
    hold = AckHold(60.0, max_bytes=100)
    for i in range(15):
        hold.hold(_rec(i, size=10), now=0.0)
    assert len(hold) == 10 and hold.released_early == 5
    assert [r.seq for r in hold.take_all()] == list(range(5, 15))


def test_zero_hold_keeps_nothing() -> None:
    hold = AckHold(0.0)
    hold.hold(_rec(1), now=0.0)
    assert len(hold) == 0 and hold.take_all() == []
