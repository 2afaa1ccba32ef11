"""A fixed number of connection slots, one handler thread each, where idle connections give way to new ones.

ThreadingHTTPServer would start a thread for every connection. Here a connection needs a slot; when all
are taken, the oldest connection that is waiting for its next request (an idle keep-alive, or a fresh
connection that has sent nothing) is closed to make room, as nginx does when its connections run out.
A connection in the middle of a request is never closed, so only when every slot is busy with a request
does a newcomer wait, and then get 503.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time


class ConnectionSlots:
    """Counts served connections and knows which of them are idle (safe to close)."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("at least one connection slot is needed")
        self._free = threading.BoundedSemaphore(limit)
        self._lock = threading.Lock()
        self._idle: dict[socket.socket, float] = {}
        self._reclaimed: set[socket.socket] = set()

    def acquire(self, wait_s: float) -> bool:
        """Take a slot, closing the oldest idle connection if none is free; False after ``wait_s`` without one."""
        if self._free.acquire(blocking=False):
            return True
        self._reclaim_oldest_idle()
        return self._free.acquire(timeout=wait_s)

    def release(self, conn: socket.socket) -> None:
        with self._lock:
            self._idle.pop(conn, None)
            self._reclaimed.discard(conn)
        self._free.release()

    def idle(self, conn: socket.socket) -> None:
        """``conn`` waits for its next request: it may be closed to make room."""
        with self._lock:
            if conn not in self._reclaimed:
                self._idle[conn] = time.monotonic()

    def busy(self, conn: socket.socket) -> bool:
        """A request started on ``conn``; False if it was closed to make room (drop the request)."""
        with self._lock:
            self._idle.pop(conn, None)
            return conn not in self._reclaimed

    def _reclaim_oldest_idle(self) -> None:
        with self._lock:
            if not self._idle:
                return
            conn = min(self._idle, key=self._idle.__getitem__)
            del self._idle[conn]
            self._reclaimed.add(conn)
        with contextlib.suppress(OSError):
            conn.shutdown(socket.SHUT_RDWR)  # its handler wakes up at end-of-file, exits and frees the slot
