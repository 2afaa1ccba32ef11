"""ReleasedAcks: which acked records, no longer held, the broker lost (issue 18, finding 6)."""

from __future__ import annotations

from clocktower.producers.lost_acks import ReleasedAcks


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_record_missing_or_replaced_at_its_offset_is_lost_once() -> None:
    acks = ReleasedAcks(clock=_Clock())
    for off in range(5):
        acks.released("t", 0, off, b"r%d" % off, events=10)
    acks.released("t", 1, 7, b"other-partition", events=3)
    checked, first = acks.to_check()
    assert first == {("t", 0): 0, ("t", 1): 7}
    acks.released("t", 0, 5, b"r5", events=10)      # during the read-back: not judged by it
    # the broker came back with offsets 0-2; offset 3 was handed out again to someone else's record
    lost = acks.lost(checked, {("t", 0): {0: b"r0", 1: b"r1", 2: b"r2", 3: b"someone-else"}})
    assert sorted(r.offset for r in lost) == [3, 4] and sum(r.events for r in lost) == 20
    assert len(acks) == 2                           # partition 1 was not read, and offset 5 came after: kept
    checked, first = acks.to_check()
    assert first == {("t", 0): 5, ("t", 1): 7}


def test_the_window_ends_when_the_broker_went_away() -> None:
    clock = _Clock()
    acks = ReleasedAcks(window_s=60, clock=clock)
    acks.released("t", 0, 1, b"old", events=1)     # at 100
    clock.now = 150
    acks.released("t", 0, 2, b"new", events=1)
    clock.now = 155 + 3600                          # the broker went away at 155 and stayed away an hour
    assert acks.to_check(155)[1] == {("t", 0): 1}   # both released within the 60 s before it went away
    assert acks.to_check(200)[1] == {("t", 0): 2} and len(acks) == 1   # at 200: the one at 100 is out


def test_records_without_an_id_or_offset_are_not_tracked() -> None:
    acks = ReleasedAcks(clock=_Clock())
    acks.released("t", 0, 1, None, events=1)
    acks.released("t", 0, -1, b"r", events=1)
    assert len(acks) == 0


def test_a_release_the_broker_deleted_after_every_reader_read_it_is_not_lost() -> None:
    """The embedded broker deletes consumed records (clocktower/log_trim.py): a release below where the log now
    starts arrived; one at or past it is judged as before."""
    acks = ReleasedAcks(clock=_Clock())
    for off in range(4):
        acks.released("t", 0, off, b"r%d" % off, events=1)
    checked, _ = acks.to_check()
    lost = acks.lost(checked, {("t", 0): {2: b"r2", 3: b"someone-else"}}, {("t", 0): 2})
    assert [r.offset for r in lost] == [3]
    assert len(acks) == 0
