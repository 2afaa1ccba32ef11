"""A pool of engine sessions in which inserts go first.

Each chdb connection is its own ClickHouse session and they run queries in
parallel, so a slow read holds only its own session. Waiting inserts are
served before any other waiter, and ``reserved`` sessions only ever run
inserts: however many slow reads arrive, an insert never waits behind one.
A returned session passes through ``renew`` first, which swaps a broken
session for a fresh one or returns None when it cannot: the broken session is
then set aside (the pool serves with one session fewer) and renewal is retried
at most every ``RETRY_S``, so a broken session is never handed out again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

from clocktower.sinks.endpoint.errors import TOO_MANY_SIMULTANEOUS_QUERIES, ClickHouseError

T = TypeVar("T")
RETRY_S = 5.0
logger = logging.getLogger(__name__)


class SessionPool(Generic[T]):
    """Hands out one session at a time per caller; priority callers (inserts) first."""

    def __init__(self, sessions: list[T], reserved: int = 0, renew: Callable[[T], T | None] | None = None) -> None:
        if not 0 <= reserved < len(sessions) or not sessions:
            raise ValueError("a pool needs at least one session that is not reserved")
        self._size = len(sessions)
        self._free = list(sessions)
        self._broken: list[T] = []  # could not be renewed yet: never handed out
        self._retry_at = 0.0
        self._reserved = reserved
        self._cond = threading.Condition()
        self._priority_waiting = 0
        self._renew = renew

    @contextmanager
    def acquire(self, priority: bool, timeout_s: float) -> Iterator[T]:
        self._retry_broken()
        session = self._take(priority, timeout_s)
        try:
            yield session
        finally:
            self._give_back(session)

    def _give_back(self, session: T) -> None:
        renewed = session if self._renew is None else self._renew(session)
        with self._cond:
            if renewed is None:
                self._broken.append(session)
                self._retry_at = time.monotonic() + RETRY_S
                logger.error("a broken engine session could not be replaced: the pool serves with %d of %d",
                             self._size - len(self._broken), self._size)
            else:
                self._free.append(renewed)
            self._cond.notify_all()

    def _retry_broken(self) -> None:
        """Try again to renew the sessions set aside, at most once every ``RETRY_S``."""
        with self._cond:
            if not self._broken or time.monotonic() < self._retry_at:
                return
            retry, self._broken = self._broken, []
        for session in retry:
            self._give_back(session)

    def _may_take(self, priority: bool) -> bool:
        if priority:
            return bool(self._free)
        return self._priority_waiting == 0 and len(self._free) > self._reserved

    def _take(self, priority: bool, timeout_s: float) -> T:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            if priority:
                self._priority_waiting += 1
            try:
                while not self._may_take(priority):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        message = f"No free engine session within {timeout_s:g} s: too many simultaneous queries"
                        raise ClickHouseError(TOO_MANY_SIMULTANEOUS_QUERIES, message)
                    self._cond.wait(left)
                return self._free.pop()
            finally:
                if priority:
                    self._priority_waiting -= 1
                    self._cond.notify_all()  # others may go now
