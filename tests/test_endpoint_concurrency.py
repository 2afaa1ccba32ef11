"""Concurrent reads run side by side, and a read costs one engine call (issue 9, item 9).

Ten reads in parallel took 70-190 ms each against 12 ms alone: two sessions per pool queued them, and
every read paid four engine round trips (guard parse, SET of its timeout, the query, the reset). These
tests count overlap and engine calls, never time: benchmarks/endpoint_concurrency.py gives the figures.
"""

from __future__ import annotations

import base64
import http.client
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from clocktower.sinks.endpoint import ChdbEngine, ClickHouseHttpEndpoint
from clocktower.sinks.endpoint.auth import User
from clocktower.sinks.endpoint.engine_session import EngineSession

USER, PASSWORD = "conc", "a-concurrency-password"
PARALLEL = 10


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClickHouseHttpEndpoint]:
    engine = ChdbEngine(Path(tmp_path_factory.mktemp("chdb-conc")))  # default limits: what `clocktower up` runs
    users = {USER: User(PASSWORD, readonly=False), "viewer": User(PASSWORD, readonly=True)}
    server = ClickHouseHttpEndpoint(engine, port=0, users=users)
    server.start()
    yield server
    server.stop()
    engine.close()


class InFlight:
    """Counts the sleep queries inside the engine at once, by wrapping EngineSession.query."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.now = self.most = 0
        self.lock = threading.Lock()
        real = EngineSession.query

        def query(session: EngineSession, sql: str | bytes, *args: Any, **kwargs: Any) -> Any:
            counted = b"sleep" in (sql.encode() if isinstance(sql, str) else sql) and b"parseQuery" not in sql
            if counted:
                with self.lock:
                    self.now += 1
                    self.most = max(self.most, self.now)
            try:
                return real(session, sql, *args, **kwargs)
            finally:
                if counted:
                    with self.lock:
                        self.now -= 1

        monkeypatch.setattr(EngineSession, "query", query)


@pytest.mark.parametrize("user, method", [(USER, "GET"), (USER, "POST"), ("viewer", "POST")])
def test_ten_reads_run_at_once(
    endpoint: ClickHouseHttpEndpoint, monkeypatch: pytest.MonkeyPatch, user: str, method: str
) -> None:
    """Every pool (GETs, writers' POSTs, the read-only role) serves ten reads together."""
    in_flight = InFlight(monkeypatch)
    gate = threading.Barrier(PARALLEL)
    errors: list[BaseException] = []

    def read() -> None:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", endpoint.port, timeout=60)
            token = base64.b64encode(f"{user}:{PASSWORD}".encode()).decode()
            headers = {"Authorization": f"Basic {token}"}
            gate.wait(timeout=60)
            if method == "GET":
                conn.request("GET", "/?query=SELECT+sleep(1.5)", headers=headers)
            else:
                conn.request("POST", "/", body=b"SELECT sleep(1.5)", headers=headers)
            response = conn.getresponse()
            assert (response.status, response.read()) == (200, b"0\n")
        except BaseException as ex:  # re-raised in the test thread
            errors.append(ex)

    threads = [threading.Thread(target=read) for _ in range(PARALLEL)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors
    assert in_flight.most == PARALLEL, f"only {in_flight.most} of {PARALLEL} reads ran at once"


def test_a_repeated_read_costs_one_engine_call(
    endpoint: ClickHouseHttpEndpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[bytes] = []
    real = EngineSession.query

    def query(session: EngineSession, sql: str | bytes, *args: Any, **kwargs: Any) -> Any:
        sent.append(sql.encode() if isinstance(sql, str) else sql)
        return real(session, sql, *args, **kwargs)

    monkeypatch.setattr(EngineSession, "query", query)
    engine = endpoint.engine
    for readonly in (1, 2):  # the readers' pools, whose sessions' baseline is the read timeout cap
        statement = b"SELECT count() FROM system.one WHERE dummy = %d" % readonly
        engine.execute(statement, readonly=readonly, guard=statement)
        sent.clear()
        assert engine.execute(statement, readonly=readonly, guard=statement).data == b"0\n"
        assert sent == [statement], f"readonly={readonly}: {sent}"
    # Writers' sessions (baseline: the write cap) still set the read cap around a read, but never parse again.
    statement = b"SELECT count() FROM system.one"
    engine.execute(statement, guard=statement)
    sent.clear()
    assert engine.execute(statement, guard=statement).data == b"1\n"
    assert statement in sent and not any(b"parseQuery" in sql for sql in sent)
    # A refused statement is judged every time, never remembered as allowed.
    for _ in range(2):
        with pytest.raises(Exception, match="ACCESS_DENIED"):
            engine.execute(b"SELECT * FROM file('/etc/passwd')", readonly=2, guard=b"SELECT * FROM file('/etc/passwd')")
