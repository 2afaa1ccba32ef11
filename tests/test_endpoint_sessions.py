"""Broken engine sessions: never handed out again, never opened after close (sinks/endpoint/session_pool.py,
engine_session.py, engine.py). A stand-in chdb connection makes failures happen on cue."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from clocktower.sinks.endpoint import engine as engine_module
from clocktower.sinks.endpoint import session_pool
from clocktower.sinks.endpoint.engine import ChdbEngine
from clocktower.sinks.endpoint.engine_session import EngineSession
from clocktower.sinks.endpoint.session_pool import SessionPool


class FakeResult:
    def __init__(self, data: bytes) -> None:
        self.data = data

    def bytes(self) -> bytes:
        return self.data


class FakeConn:
    """Answers like a chdb connection; ``fail`` makes every query whose text contains it fail."""

    def __init__(self) -> None:
        self.fail: str | None = None
        self.closed = False
        self.sent: list[str] = []

    def query(self, sql: str, fmt: str = "TabSeparated", params: Any = None) -> FakeResult:
        self.sent.append(sql)
        if self.fail is not None and self.fail in sql:
            raise RuntimeError("Code: 1001. DB::Exception: failed on cue. (STD_EXCEPTION)")
        if "clocktower-session-flush" in sql:
            return FakeResult(b"clocktower-session-flush\n")
        return FakeResult(b"")

    def close(self) -> None:
        self.closed = True


def test_a_failed_reset_remembers_what_is_still_set() -> None:
    conn = FakeConn()
    session = EngineSession(conn, 0, 10)  # type: ignore[arg-type]
    session.apply({"max_threads": "3"})
    conn.fail = "SET max_threads = DEFAULT"
    session.reset()
    assert session.broken
    conn.fail = None
    session.reset()  # a later reset still knows max_threads leaked
    assert conn.sent[-1] == "SET max_threads = DEFAULT"
    assert not session._applied


def test_a_broken_session_that_cannot_be_replaced_is_never_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(session_pool, "RETRY_S", 0.0, raising=False)
    broken, sound = FakeConn(), FakeConn()
    replacement: list[FakeConn | None] = [None]

    def renew(conn: FakeConn) -> FakeConn | None:
        return replacement[0] if conn is broken else conn

    pool = SessionPool([sound, broken], renew=renew)
    with pool.acquire(priority=False, timeout_s=1) as first:
        assert first is broken  # the last in the list goes first
    for _ in range(3):  # it cannot be replaced: the pool serves with the other session only
        with pool.acquire(priority=False, timeout_s=1) as conn:
            assert conn is sound
            with pytest.raises(Exception, match="No free engine session"), pool.acquire(False, 0.05):
                pass
    replacement[0] = FakeConn()  # renewal is retried later, and the fresh session joins the pool
    with pool.acquire(priority=False, timeout_s=1) as a, pool.acquire(priority=False, timeout_s=1) as b:
        assert {a, b} == {sound, replacement[0]}


def _bare_engine() -> ChdbEngine:
    """A ChdbEngine without chdb: only what _renew and close use."""
    engine = ChdbEngine.__new__(ChdbEngine)
    engine.path = "/nonexistent/clocktower-test"
    engine._sessions = []
    engine._closed = False
    engine._close_lock = threading.Lock()
    return engine


def test_renewal_never_opens_a_session_after_close(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = _bare_engine()
    old = EngineSession(FakeConn(), 0, 10)  # type: ignore[arg-type]
    old.broken = True
    engine._sessions.append(old)
    opened: list[FakeConn] = []
    closer = threading.Thread(target=engine.close)

    def connect(path: str) -> FakeConn:
        closer.start()  # close() comes in while the replacement is being opened
        closer.join(0.3)
        opened.append(FakeConn())
        return opened[-1]

    monkeypatch.setattr(engine_module.chdb, "connect", connect)
    engine._renew(old)
    closer.join(5)
    assert not closer.is_alive()
    assert opened and all(conn.closed for conn in opened), "a session opened during close() was left open"
    assert old.conn.closed  # type: ignore[attr-defined]
    assert engine._renew(old) is None  # after close nothing is opened
    assert len(opened) == 1
