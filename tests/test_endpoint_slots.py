"""The order in which ConnectionSlots closes connections to make room (sinks/endpoint/connection_slots.py)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from clocktower.sinks.endpoint.connection_slots import ConnectionSlots


@pytest.fixture
def pairs() -> Iterator[list[tuple[socket.socket, socket.socket]]]:
    made: list[tuple[socket.socket, socket.socket]] = []
    yield made
    for a, b in made:
        a.close()
        b.close()


def _closed(peer: socket.socket) -> bool:
    """True if the server side of ``peer``'s pair was shut down."""
    peer.settimeout(0.01)
    try:
        return peer.recv(1) == b""
    except TimeoutError:
        return False


def test_reclaim_order(pairs: list[tuple[socket.socket, socket.socket]]) -> None:
    """Sent nothing, then unauthenticated mid-headers, then idle keep-alive; an authenticated one never."""
    slots = ConnectionSlots(4)
    pairs.extend(socket.socketpair() for _ in range(4))
    (keep_alive, _), (headers, _), (fresh, _), (logged_in, _) = pairs
    for _ in range(4):
        assert slots.acquire(0)
    slots.idle(logged_in)  # logs in, is served, then its next request begins
    slots.started(logged_in, 60)
    assert slots.busy(logged_in)
    slots.idle(logged_in)
    slots.started(logged_in, 60)
    slots.idle(keep_alive)  # served once without logging in (e.g. /ping), now idle: the oldest of all
    slots.started(keep_alive, 60)
    slots.idle(keep_alive)
    time.sleep(0.01)
    slots.idle(headers)
    slots.started(headers, 60)
    time.sleep(0.01)
    slots.idle(fresh)  # the newest, but has sent nothing
    order: list[list[int]] = []
    for _ in range(3):
        assert not slots.acquire(0.05)  # each try closes one connection; its handler would free the slot
        done = {i for step in order for i in step}
        order.append([i for i, (_, peer) in enumerate(pairs) if i not in done and _closed(peer)])
    assert order == [[2], [1], [0]]
    assert not slots.acquire(0.05)
    assert not _closed(pairs[3][1]), "an authenticated connection mid-request was closed to make room"
    slots.release(fresh)
    assert slots.acquire(0)


def test_an_authenticated_connection_is_still_held_to_the_header_deadline(
        pairs: list[tuple[socket.socket, socket.socket]]) -> None:
    slots = ConnectionSlots(1)
    pairs.append(socket.socketpair())
    conn, peer = pairs[0]
    assert slots.acquire(0)
    slots.idle(conn)
    slots.started(conn, 60)
    assert slots.busy(conn)
    slots.idle(conn)
    slots.started(conn, 0.1)  # a logged-in client trickles its next request's headers
    deadline = time.monotonic() + 2
    while not _closed(peer) and time.monotonic() < deadline:
        pass
    assert time.monotonic() < deadline
    assert not slots.busy(conn)
