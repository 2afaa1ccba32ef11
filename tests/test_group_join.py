"""A stream worker whose group join goes wrong rejoins, or ends for a restart; it never stays up idle.

Against aiokafka's own rebalance and coordination code, with the coordinator's network side faked: the
embedded broker's empty SyncGroup assignment could not be provoked on demand (seen once in CI and once in
7 runs of tests/test_scale_out.py beside a CPU hog: two of three workers then held no partitions and the run
never drained).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from types import SimpleNamespace

import aiokafka.consumer.group_coordinator as group_coordinator
import pytest
from aiokafka.errors import KafkaError

from clocktower.streams.engine import group_join


class _Subscription:
    topics = frozenset({"telemetry.links"})
    active = True


class _Assignor:
    name = "roundrobin"

    @staticmethod
    def metadata(topics: object) -> bytes:
        return b"metadata"


def _coordinator(assignment: bytes) -> group_coordinator.GroupCoordinator:
    """aiokafka's own GroupCoordinator, its network faked: joins as a follower, and SyncGroup gives `assignment`."""
    c = object.__new__(group_coordinator.GroupCoordinator)
    c.group_id, c.coordinator_id, c._group_instance_id = "g", 0, "clocktower-streams-test"
    c.member_id, c.generation = "", -1
    c._session_timeout_ms, c._rebalance_timeout_ms, c._retry_backoff_ms = 10_000, 30_000, 1
    c._assignors = [_Assignor]
    c._rejoin_needed_fut = asyncio.get_running_loop().create_future()
    c.joined = []                                       # what _on_join_complete was given

    async def send_req(request: object) -> SimpleNamespace:
        if type(request).__name__.startswith("JoinGroup"):
            return SimpleNamespace(error_code=0, member_id="member-2", generation_id=8, group_protocol="roundrobin",
                                   leader_id="member-1")
        assert type(request).__name__.startswith("SyncGroup")
        return SimpleNamespace(error_code=0, member_assignment=assignment)

    async def on_join_complete(*args: object) -> None:
        c.joined.append(args)

    c._send_req, c._on_join_complete = send_req, on_join_complete
    return c


async def _rejoin(c: group_coordinator.GroupCoordinator) -> bool:
    """One pass of aiokafka's own rejoin, as its coordination routine makes it."""
    return await group_coordinator.GroupCoordinator._do_rejoin_group(c, _Subscription())


@pytest.fixture
def guarded(monkeypatch: pytest.MonkeyPatch) -> list[BaseException]:
    """install()ed for this test only; returns the failures reported instead of exiting."""
    failures: list[BaseException] = []
    monkeypatch.setattr(group_coordinator, "CoordinatorGroupRebalance", group_coordinator.CoordinatorGroupRebalance)
    monkeypatch.setattr(group_coordinator.GroupCoordinator, "_coordination_routine",
                        group_coordinator.GroupCoordinator._coordination_routine)
    monkeypatch.setattr(group_join, "on_coordination_failure", group_join.on_coordination_failure)
    group_join.install(failures.append)
    return failures


def test_an_empty_assignment_makes_the_worker_rejoin_instead_of_decoding_it(guarded: list) -> None:
    async def run() -> None:
        c = _coordinator(b"")
        assert await _rejoin(c) is False                 # not joined: the routine joins again after its backoff
        assert c.joined == [] and c._rejoin_needed_fut.done()
        assert guarded == []
    asyncio.run(run())


def test_without_the_guard_aiokafka_fails_on_the_empty_assignment(monkeypatch: pytest.MonkeyPatch) -> None:
    """What happened in CI: the decode raises, and the coordination routine dies with it."""
    aiokafkas_own = group_join.RejoinOnEmptyAssignment.__mro__[1]
    monkeypatch.setattr(group_coordinator, "CoordinatorGroupRebalance", aiokafkas_own)

    async def run() -> None:
        c = _coordinator(b"")
        c._on_join_complete = lambda *a: group_coordinator.GroupCoordinator._on_join_complete(c, *a)
        c._lookup_assignor = lambda name: _Assignor
        with pytest.raises(ValueError, match="unpack requires"):
            await _rejoin(c)
    asyncio.run(run())


def test_a_real_assignment_is_joined_unchanged(guarded: list) -> None:
    assignment = b"\x00\x00\x00\x00\x00\x01\x00\x01t\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00"

    async def run() -> None:
        c = _coordinator(assignment)
        assert await _rejoin(c) is True
        assert [args[-1] for args in c.joined] == [assignment]
    asyncio.run(run())


def test_empty_assignments_in_a_row_end_the_worker_and_a_real_one_resets_the_count(guarded: list) -> None:
    async def run() -> None:
        c = _coordinator(b"")
        for _ in range(group_join.MAX_EMPTY_ASSIGNMENTS - 1):
            await _rejoin(c)
        assert guarded == []
        await _rejoin(c)
        assert len(guarded) == 1 and "empty assignments in a row" in str(guarded[0])
        real = _coordinator(b"\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00")
        real.clocktower_empty_assignments = group_join.MAX_EMPTY_ASSIGNMENTS - 1
        assert await _rejoin(real) is True and real.clocktower_empty_assignments == 0
    asyncio.run(run())


def _coordinator_whose_routine_raises(exc: BaseException) -> SimpleNamespace:
    """Enough of a GroupCoordinator for aiokafka's own _coordination_routine wrapper to run and fail."""
    async def routine() -> None:
        raise exc

    aborted: list[BaseException] = []
    return SimpleNamespace(_GroupCoordinator__coordination_routine=routine,
                           _subscription=SimpleNamespace(abort_waiters=aborted.append), aborted=aborted)


def test_a_dead_coordination_task_calls_the_failure_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    failures: list[BaseException] = []
    monkeypatch.setattr(group_join, "on_coordination_failure", failures.append)
    fake = _coordinator_whose_routine_raises(ValueError("unpack requires a buffer of 2 bytes"))
    with pytest.raises(KafkaError):
        asyncio.run(group_join._guarded_routine(fake))
    assert len(failures) == 1 and isinstance(failures[0], KafkaError)
    assert isinstance(failures[0].__cause__, ValueError)


def test_a_cancelled_coordination_task_is_not_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    failures: list[BaseException] = []
    monkeypatch.setattr(group_join, "on_coordination_failure", failures.append)
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(group_join._guarded_routine(_coordinator_whose_routine_raises(asyncio.CancelledError())))
    assert failures == []


def test_by_default_a_failure_ends_the_process_with_its_own_exit_code() -> None:
    code = ("import logging; logging.basicConfig(); from clocktower.streams.engine import group_join; "
            "group_join.on_coordination_failure(ValueError('boom')); print('still running')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == group_join.EXIT_COORDINATION_FAILED
    assert "still running" not in done.stdout
    assert "consumer group coordination failed" in done.stderr and "boom" in done.stderr
