"""A fixed number of connection slots, one handler thread each, where idle connections give way to new ones.

ThreadingHTTPServer would start a thread for every connection. Here every accepted connection takes a slot
(and its thread) at once; when all are taken, one is closed to make room, as nginx does when its
connections run out, in this order: first a connection that has sent nothing since it was accepted, then
one still sending its request line and headers that has never authenticated (oldest request first), then an
idle keep-alive connection between requests (idle longest first). A connection that has authenticated once
and is in a request (even one still sending the headers of its next request, as urllib3's pooled
connections do) is never closed to make room: a newcomer without credentials cannot cut a client off
mid-request. When every slot holds such a connection, a newcomer waits, then gets 503. A connection whose
request line and headers do not arrive within the header deadline of its first byte is closed too, so a
slowloris client that trickles a byte at a time neither holds a slot nor locks anyone out.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time

_FRESH, _HEADERS, _IDLE = 0, 1, 2  # reclaim order: sent nothing yet, unauthenticated mid-headers, keep-alive


class ConnectionSlots:
    """Counts served connections and knows which of them are reclaimable (safe to close), in which order."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("at least one connection slot is needed")
        self._free = threading.BoundedSemaphore(limit)
        self._cond = threading.Condition()
        self._reclaimable: tuple[dict[socket.socket, float], ...] = ({}, {}, {})  # by tier: conn -> since
        self._requested: set[socket.socket] = set()  # has begun a request since accept
        self._authenticated: set[socket.socket] = set()  # has been served an authenticated request
        self._reclaimed: set[socket.socket] = set()
        self._deadlines: dict[socket.socket, float] = {}
        self._reaper: threading.Thread | None = None

    def acquire(self, wait_s: float) -> bool:
        """Take a slot, closing the first reclaimable connection if none is free; False after ``wait_s``."""
        if self._free.acquire(blocking=False):
            return True
        self._reclaim_one()
        return self._free.acquire(timeout=wait_s)

    def release(self, conn: socket.socket) -> None:
        with self._cond:
            self._forget(conn)
            self._requested.discard(conn)
            self._authenticated.discard(conn)
            self._reclaimed.discard(conn)
        self._free.release()

    def idle(self, conn: socket.socket) -> None:
        """``conn`` waits for its first or next request: it may be closed to make room."""
        with self._cond:
            self._forget(conn)
            if conn not in self._reclaimed:
                tier = _IDLE if conn in self._requested else _FRESH
                self._reclaimable[tier][conn] = time.monotonic()

    def started(self, conn: socket.socket, within_s: float) -> None:
        """A request began on ``conn``: it is closed unless ``busy`` within ``within_s``.

        It stays reclaimable only if it has never authenticated.
        """
        with self._cond:
            if conn in self._reclaimed:
                return
            self._forget(conn)
            self._requested.add(conn)
            if conn not in self._authenticated:
                self._reclaimable[_HEADERS][conn] = time.monotonic()
            self._deadlines[conn] = time.monotonic() + within_s
            if self._reaper is None:
                self._reaper = threading.Thread(target=self._reap, name="endpoint-header-deadline", daemon=True)
                self._reaper.start()
            self._cond.notify_all()

    def busy(self, conn: socket.socket) -> bool:
        """An authenticated request is being served on ``conn``; False if it was closed (drop the request)."""
        with self._cond:
            self._forget(conn)
            if conn in self._reclaimed:
                return False
            self._authenticated.add(conn)
            return True

    def authenticated(self) -> int:
        """How many open connections have begun an authenticated request: never reclaimed to make room."""
        with self._cond:
            return len(self._authenticated)

    def reclaimable(self) -> tuple[int, int, int]:
        """How many connections could be closed now: sent nothing, unauthenticated mid-headers, idle."""
        with self._cond:
            fresh, headers, idle = (len(tier) for tier in self._reclaimable)
            return fresh, headers, idle

    def _forget(self, conn: socket.socket) -> None:
        """Drop ``conn``'s reclaimable entry and header deadline (lock held)."""
        for tier in self._reclaimable:
            tier.pop(conn, None)
        self._deadlines.pop(conn, None)

    def _reclaim_one(self) -> None:
        with self._cond:
            for tier in self._reclaimable:
                if tier:
                    self._reclaim(min(tier, key=tier.__getitem__))
                    return

    def _reclaim(self, conn: socket.socket) -> None:
        """Close ``conn`` (lock held): its handler wakes up at end-of-file, exits and frees the slot."""
        self._forget(conn)
        self._reclaimed.add(conn)
        with contextlib.suppress(OSError):
            conn.shutdown(socket.SHUT_RDWR)

    def _reap(self) -> None:
        """Close connections past their header deadline; exits when none is pending."""
        with self._cond:
            while self._deadlines:
                now = time.monotonic()
                for conn in [c for c, deadline in self._deadlines.items() if deadline <= now]:
                    self._reclaim(conn)
                if self._deadlines:
                    self._cond.wait(max(min(self._deadlines.values()) - now, 0.01))
            self._reaper = None
