"""A stream worker whose group join goes wrong rejoins, or ends for a restart; it never stays up idle.

Against aiokafka's own rebalance and coordination code, with the coordinator's network side faked: the
embedded broker's empty SyncGroup assignment could not be provoked on demand (seen in 1 of ~6 loaded runs
of tests/test_scale_out.py, where two of three workers then held no partitions and the run never drained).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from types import SimpleNamespace

import aiokafka.consumer.group_coordinator as group_coordinator
import pytest
from aiokafka.errors import KafkaError
from aiokafka.protocol.group import SyncGroupRequest

from clocktower.streams import group_join


class _Coordinator:
    """What CoordinatorGroupRebalance asks of its GroupCoordinator when it syncs, answered by `assignment`."""

    _rebalance_timeout_ms = 10_000
    _group_instance_id = "clocktower-streams-test"

    def __init__(self, assignment: bytes) -> None:
        self.assignment = assignment
        self.generation, self.member_id = 7, "member-1"
        self.rejoins = 0

    async def _send_req(self, request: object) -> SimpleNamespace:
        return SimpleNamespace(error_code=0, member_assignment=self.assignment)

    def request_rejoin(self) -> None:
        self.rejoins += 1


def _sync(assignment: bytes) -> tuple[bytes | None, int]:
    coordinator = _Coordinator(assignment)
    rebalance = group_join.RejoinOnEmptyAssignment(coordinator, "g", 0, None, [], 10_000, 100)
    request = SyncGroupRequest("g", coordinator.generation, coordinator.member_id, coordinator._group_instance_id, [])
    got = asyncio.run(rebalance._send_sync_group_request(request))
    return got, coordinator.rejoins


def test_an_empty_assignment_asks_for_a_rejoin_instead_of_being_decoded() -> None:
    assert _sync(b"") == (None, 1)


def test_a_real_assignment_is_passed_on_unchanged() -> None:
    assignment = b"\x00\x00\x00\x00\x00\x01\x00\x01t\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00"
    assert _sync(assignment) == (assignment, 0)


def test_install_makes_aiokafka_use_both_guards() -> None:
    before = (group_coordinator.CoordinatorGroupRebalance, group_coordinator.GroupCoordinator._coordination_routine,
              group_join.on_coordination_failure)
    try:
        group_join.install()
        assert group_coordinator.CoordinatorGroupRebalance is group_join.RejoinOnEmptyAssignment
        assert group_coordinator.GroupCoordinator._coordination_routine is group_join._guarded_routine
    finally:
        (group_coordinator.CoordinatorGroupRebalance, group_coordinator.GroupCoordinator._coordination_routine,
         group_join.on_coordination_failure) = before


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
    code = ("import logging; logging.basicConfig(); from clocktower.streams import group_join; "
            "group_join.on_coordination_failure(ValueError('boom')); print('still running')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == group_join.EXIT_COORDINATION_FAILED
    assert "still running" not in done.stdout
    assert "consumer group coordination failed" in done.stderr and "boom" in done.stderr
