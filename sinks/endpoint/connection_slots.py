"""A fixed number of connection slots, one handler thread each, where idle connections give way to new ones.

ThreadingHTTPServer would start a thread for every connection. Here a connection needs a slot; when all
are taken, the oldest connection that is not yet serving an authenticated request (an idle keep-alive, a
fresh connection that has sent nothing, or one still sending its request line and headers) is closed to
make room, as nginx does when its connections run out. A connection whose request line and headers do not
arrive within the header deadline of its first byte is closed too, so a slowloris client that trickles a
byte at a time neither holds a slot nor locks anyone out. Only a connection serving an authenticated
request is never closed: when every slot is busy with one, a newcomer waits, then gets 503.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time


class ConnectionSlots:
    """Counts served connections and knows which of them are reclaimable (safe to close)."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("at least one connection slot is needed")
        self._free = threading.BoundedSemaphore(limit)
        self._cond = threading.Condition()
        self._idle: dict[socket.socket, float] = {}
        self._reclaimed: set[socket.socket] = set()
        self._deadlines: dict[socket.socket, float] = {}
        self._reaper: threading.Thread | None = None

    def acquire(self, wait_s: float) -> bool:
        """Take a slot, closing the oldest reclaimable connection if none is free; False after ``wait_s``."""
        if self._free.acquire(blocking=False):
            return True
        self._reclaim_oldest_idle()
        return self._free.acquire(timeout=wait_s)

    def release(self, conn: socket.socket) -> None:
        with self._cond:
            self._idle.pop(conn, None)
            self._deadlines.pop(conn, None)
            self._reclaimed.discard(conn)
        self._free.release()

    def idle(self, conn: socket.socket) -> None:
        """``conn`` waits for its next request: it may be closed to make room."""
        with self._cond:
            self._deadlines.pop(conn, None)
            if conn not in self._reclaimed:
                self._idle[conn] = time.monotonic()

    def started(self, conn: socket.socket, within_s: float) -> None:
        """A request began on ``conn``: it stays reclaimable, and is closed unless ``busy`` within ``within_s``."""
        with self._cond:
            if conn in self._reclaimed:
                return
            self._deadlines[conn] = time.monotonic() + within_s
            if self._reaper is None:
                self._reaper = threading.Thread(target=self._reap, name="endpoint-header-deadline", daemon=True)
                self._reaper.start()
            self._cond.notify_all()

    def busy(self, conn: socket.socket) -> bool:
        """An authenticated request is being served on ``conn``; False if it was closed (drop the request)."""
        with self._cond:
            self._idle.pop(conn, None)
            self._deadlines.pop(conn, None)
            return conn not in self._reclaimed

    def _reclaim_oldest_idle(self) -> None:
        with self._cond:
            if not self._idle:
                return
            conn = min(self._idle, key=self._idle.__getitem__)
            self._reclaim(conn)

    def _reclaim(self, conn: socket.socket) -> None:
        """Close ``conn`` (lock held): its handler wakes up at end-of-file, exits and frees the slot."""
        self._idle.pop(conn, None)
        self._deadlines.pop(conn, None)
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
