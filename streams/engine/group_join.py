"""Keep a stream worker in its consumer group, or end it so it is restarted: never alive but idle.

Seen under load against the embedded broker (noida-db), with 3 workers joining at once: the broker
answered a follower's SyncGroup with no error and an empty assignment (b''). aiokafka cannot decode
that, its coordination task dies, and the worker stays up holding no partitions: the group looks
stable, and nothing is consumed or committed again (the pipeline never drains).

`install()` changes two things in aiokafka, for every consumer started afterwards (Faust's included):
- an empty assignment asks for a rejoin, as a SyncGroup refused for a rebalance does (5 in a row end
  the worker, as below);
- should the coordination task die for any other reason, `on_coordination_failure` is called, by
  default ending the process with EXIT_COORDINATION_FAILED so its supervisor restarts it. That loses
  nothing: offsets are committed only for handled records and tables have changelogs, the same as a
  worker killed with SIGKILL (tests/test_scale_out.py).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable

import aiokafka.consumer.group_coordinator as group_coordinator

log = logging.getLogger(__name__)

EXIT_COORDINATION_FAILED = 70   # EX_SOFTWARE
MAX_EMPTY_ASSIGNMENTS = 5       # in a row: then the worker ends for a restart instead of rejoining again


def end_for_restart(why: str) -> None:
    """End the worker at once, saying `why`: a supervisor (`clocktower up`, systemd) restarts it with its
    partitions (streams/commit_stall.py ends it this way too)."""
    log.critical("%s: exiting with %d so the worker is restarted", why, EXIT_COORDINATION_FAILED)
    sys.stderr.flush()
    os._exit(EXIT_COORDINATION_FAILED)


def exit_for_restart(exc: BaseException) -> None:
    """The default `on_coordination_failure`."""
    end_for_restart(f"consumer group coordination failed ({exc!r})")


on_coordination_failure: Callable[[BaseException], None] = exit_for_restart


class RejoinOnEmptyAssignment(group_coordinator.CoordinatorGroupRebalance):
    """aiokafka's rebalance, but an empty SyncGroup assignment means: join again; `MAX_EMPTY_ASSIGNMENTS` in a
    row (a broker that keeps answering so, as Kafka would a static member whose assignment it stored empty)
    are a coordination failure: the worker is not left rejoining forever with no partitions."""

    async def _send_sync_group_request(self, request):  # noqa: ANN001, ANN202 - aiokafka's types
        assignment = await super()._send_sync_group_request(request)
        coordinator = self._coordinator
        if assignment is None or len(assignment) > 0:
            coordinator.clocktower_empty_assignments = 0
            return assignment
        empties = getattr(coordinator, "clocktower_empty_assignments", 0) + 1
        coordinator.clocktower_empty_assignments = empties
        log.warning("group %s: the broker sent member %s an empty assignment for generation %s (%d in a row); "
                    "rejoining", self.group_id, coordinator.member_id, coordinator.generation, empties)
        if empties >= MAX_EMPTY_ASSIGNMENTS:
            on_coordination_failure(RuntimeError(f"{empties} empty assignments in a row"))
        coordinator.request_rejoin()
        return None   # perform_group_join() returns None: _do_rejoin_group backs off, then joins again


_original_routine = group_coordinator.GroupCoordinator._coordination_routine


async def _guarded_routine(self: group_coordinator.GroupCoordinator) -> None:
    try:
        await _original_routine(self)
    except Exception as exc:          # not a cancel (a BaseException): a consumer being closed is no failure
        on_coordination_failure(exc)
        raise


_original_rebalance = group_coordinator.CoordinatorGroupRebalance


def install(on_failure: Callable[[BaseException], None] = exit_for_restart, rejoin_on_empty: bool = True) -> None:
    """Patch aiokafka's group coordination as the module docstring says. The rejoin on an empty assignment makes up
    for the embedded broker (runtime/broker_profile.py): a Kafka broker sends every member its encoded assignment."""
    global on_coordination_failure
    on_coordination_failure = on_failure
    group_coordinator.CoordinatorGroupRebalance = RejoinOnEmptyAssignment if rejoin_on_empty else _original_rebalance
    group_coordinator.GroupCoordinator._coordination_routine = _guarded_routine
