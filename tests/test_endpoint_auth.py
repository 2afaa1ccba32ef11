"""Who gets into the embedded ClickHouse endpoint: users and passwords, Host/Origin checks, bounded threads.

The HTTP layer is tested in front of a stand-in protocol that records what it was asked to run (fast, and
it shows that refused requests never reach the engine); the real engine and clickhouse-connect are tested
through `python -m clocktower.sinks.endpoint` in its own process, as `clocktower up` runs it.
"""

from __future__ import annotations

import base64
import http.client
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import clickhouse_connect
import pytest
from clickhouse_connect.driver.exceptions import DatabaseError

from clocktower.generated_secrets import ensure_secrets
from clocktower.ports import free_port
from clocktower.runtime.credentials import ADMIN_USER, DASHBOARDS_USER, credentials_path, read_users
from clocktower.sinks.endpoint import ClickHouseHttpEndpoint
from clocktower.sinks.endpoint.auth import User
from clocktower.sinks.endpoint.protocol import Reply
from clocktower.sinks.endpoint.request_body import RequestBody
from clocktower.sinks.endpoint.request_params import RequestParams

REPO = Path(__file__).resolve().parents[1]
ADMIN, ADMIN_PW = "writer", "writer-password-1"
READER, READER_PW = "reader", "reader-password-2"


class RecordingProtocol:
    """Stands in for ClickHouseProtocol: answers "1\\n" and records each request with the caller's role."""

    class engine:  # noqa: N801 - the attribute the HTTP layer reads
        version = "26.9.0"
        http_compression = False

    def __init__(self) -> None:
        self.calls: list[tuple[bytes, bool]] = []

    def handle(self, method: str, params: RequestParams, body: RequestBody, body_type: str,
               readonly: bool = False) -> Reply:
        self.calls.append((params.query.encode() + body.read_all(), readonly))
        return Reply(200, b"1\n", {})

    def common_headers(self, params: Any, query_id: str | None = None) -> dict[str, str]:
        return {}


@pytest.fixture
def fake() -> Iterator[tuple[ClickHouseHttpEndpoint, RecordingProtocol]]:
    protocol = RecordingProtocol()
    users = {ADMIN: User(ADMIN_PW, readonly=False), READER: User(READER_PW, readonly=True)}
    server = ClickHouseHttpEndpoint(None, port=0, users=users, max_connections=3,  # type: ignore[arg-type]
                                    protocol=protocol)  # type: ignore[arg-type]
    server.start()
    yield server, protocol
    server.stop()


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def request(endpoint: ClickHouseHttpEndpoint, path: str = "/", body: bytes | None = b"SELECT 1",
            headers: dict[str, str] | None = None, host: str | None = None) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", endpoint.port, timeout=10)
    try:
        conn.putrequest("POST" if body is not None else "GET", path, skip_host=True)
        conn.putheader("Host", host if host is not None else f"127.0.0.1:{endpoint.port}")
        for name, value in (headers or {}).items():
            conn.putheader(name, value)
        conn.putheader("Content-Length", str(len(body or b"")))
        conn.endheaders(body or None)
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


def assert_auth_failed(status: int, headers: dict[str, str], body: bytes) -> None:
    assert status == 403, (status, body)  # what ClickHouse's HTTP handler sends for code 516
    assert headers["X-ClickHouse-Exception-Code"] == "516"
    assert body.startswith(b"Code: 516. DB::Exception: ") and b"(AUTHENTICATION_FAILED)" in body


def test_every_query_needs_a_known_user_and_its_password(fake) -> None:  # noqa: ANN001
    endpoint, protocol = fake
    assert_auth_failed(*request(endpoint))
    assert_auth_failed(*request(endpoint, headers={"Authorization": basic(ADMIN, "wrong")}))
    assert_auth_failed(*request(endpoint, headers={"Authorization": basic("nobody", ADMIN_PW)}))
    assert_auth_failed(*request(endpoint, headers={"Authorization": "Basic !!not-base64"}))
    assert_auth_failed(*request(endpoint, headers={"X-ClickHouse-User": ADMIN, "X-ClickHouse-Key": "wrong"}))
    assert_auth_failed(*request(endpoint, f"/?user={ADMIN}&password=wrong"))
    assert_auth_failed(*request(endpoint, f"/?query=SELECT+1&user={ADMIN}", body=None))
    # Two different logins in one request: refused, even when one of them is right.
    assert_auth_failed(*request(endpoint, f"/?user={READER}&password={READER_PW}",
                                headers={"Authorization": basic(ADMIN, ADMIN_PW)}))
    assert protocol.calls == [], "a refused request reached the engine"

    assert request(endpoint, headers={"Authorization": basic(ADMIN, ADMIN_PW)})[::2] == (200, b"1\n")
    assert request(endpoint, headers={"X-ClickHouse-User": ADMIN, "X-ClickHouse-Key": ADMIN_PW})[0] == 200
    assert request(endpoint, f"/?user={ADMIN}&password={ADMIN_PW}")[0] == 200
    assert len(protocol.calls) == 3
    assert request(endpoint, "/ping", body=None)[::2] == (200, b"Ok.\n")  # health checks need no login


def test_the_read_only_user_gets_the_read_only_role(fake) -> None:  # noqa: ANN001
    endpoint, protocol = fake
    assert request(endpoint, "/?readonly=0", b"DROP TABLE t", {"Authorization": basic(READER, READER_PW)})[0] == 200
    assert protocol.calls[-1] == (b"DROP TABLE t", True)
    assert request(endpoint, "/", b"CREATE TABLE t", {"Authorization": basic(ADMIN, ADMIN_PW)})[0] == 200
    assert protocol.calls[-1] == (b"CREATE TABLE t", False)


def test_host_must_name_this_endpoint(fake) -> None:  # noqa: ANN001
    endpoint, protocol = fake
    login = {"Authorization": basic(ADMIN, ADMIN_PW)}
    port = endpoint.port
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"LocalHost:{port}"):
        assert request(endpoint, headers=login, host=host)[0] == 200, host
    for host in (f"attacker.example:{port}", f"127.0.0.1:{port + 1}", "127.0.0.1", f"10.0.0.1:{port}", ""):
        status, headers, body = request(endpoint, headers=login, host=host)
        assert status == 403 and headers["X-ClickHouse-Exception-Code"] == "497", (host, status, body)
    # a DNS-rebound page cannot even ping
    assert request(endpoint, "/ping", body=None, host=f"attacker.example:{port}")[0] == 403
    assert len(protocol.calls) == 3


def test_browsers_cross_origin_requests_are_refused(fake) -> None:  # noqa: ANN001
    endpoint, protocol = fake
    login = {"Authorization": basic(ADMIN, ADMIN_PW)}
    own = f"http://127.0.0.1:{endpoint.port}"
    # What a web page's fetch(..., {method: "POST", body: "DROP TABLE t", mode: "no-cors"}) sends:
    page = {"Origin": "http://attacker.example", "Content-Type": "text/plain;charset=UTF-8",
            "Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors"}
    for headers in (page, {**login, **page}, {**login, "Origin": "null"},
                    {**login, "Origin": "http://localhost:3000"}, {**login, "Sec-Fetch-Site": "cross-site"},
                    {**login, "Sec-Fetch-Site": "same-site"}):
        status, got, _ = request(endpoint, body=b"DROP TABLE t", headers=headers)
        assert status == 403 and got["X-ClickHouse-Exception-Code"] == "497", headers
    assert protocol.calls == []
    assert request(endpoint, headers={**login, "Origin": own, "Sec-Fetch-Site": "same-origin"})[0] == 200


def _handler_threads() -> int:
    return sum("process_request_thread" in t.name for t in threading.enumerate())


def _wait_for_threads(n: int) -> None:
    deadline = time.monotonic() + 5
    while _handler_threads() < n and time.monotonic() < deadline:
        time.sleep(0.01)


def test_connections_mid_request_beyond_the_limit_wait_then_get_503(fake) -> None:  # noqa: ANN001
    endpoint, _ = fake  # max_connections=3
    before = _handler_threads()
    busy: list[socket.socket] = []
    extra: list[socket.socket] = []
    try:
        head = (f"POST / HTTP/1.1\r\nHost: 127.0.0.1:{endpoint.port}\r\nAuthorization: {basic(ADMIN, ADMIN_PW)}\r\n"
                "Content-Length: 100\r\n\r\nSELECT").encode()
        for _ in range(3):  # each is authenticated and mid-body: never closed to make room
            conn = socket.create_connection(("127.0.0.1", endpoint.port))
            conn.sendall(head)
            busy.append(conn)
        _wait_for_threads(before + 3)
        _wait_for_authenticated(endpoint, 3)  # a thread alone may not have read its headers yet: reclaimable
        extra = [socket.create_connection(("127.0.0.1", endpoint.port)) for _ in range(2)]
        for conn in extra:
            conn.settimeout(10)
            assert conn.recv(200).startswith(b"HTTP/1.1 503 "), "a connection beyond the limit got a thread"
        assert _handler_threads() == before + 3
    finally:
        for conn in busy + extra:
            conn.close()
    # The slots come back once those connections close.
    deadline = time.monotonic() + 5
    while request(endpoint, "/ping", body=None)[0] != 200 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert request(endpoint, "/ping", body=None)[0] == 200


def test_idle_connections_give_way_to_new_ones(fake) -> None:  # noqa: ANN001
    endpoint, _ = fake  # max_connections=3
    before = _handler_threads()
    keep_alive = http.client.HTTPConnection("127.0.0.1", endpoint.port, timeout=10)
    keep_alive.request("GET", "/ping")
    assert keep_alive.getresponse().read() == b"Ok.\n"  # now idle, kept alive
    silent = [socket.create_connection(("127.0.0.1", endpoint.port)) for _ in range(2)]  # connected, sent nothing
    try:
        _wait_for_threads(before + 3)
        for _ in range(5):  # every slot is idle-occupied, yet new clients get served at once
            started = time.monotonic()
            assert request(endpoint, headers={"Authorization": basic(ADMIN, ADMIN_PW)})[0] == 200
            assert time.monotonic() - started < 1.0
        assert _handler_threads() <= before + 3
    finally:
        keep_alive.close()
        for conn in silent:
            conn.close()


def _wait_for_authenticated(endpoint: ClickHouseHttpEndpoint, n: int) -> None:
    assert endpoint._server is not None
    deadline = time.monotonic() + 5
    while endpoint._server.slots.authenticated() < n and time.monotonic() < deadline:
        time.sleep(0.01)
    assert endpoint._server.slots.authenticated() == n


def _wait_for_reclaimable(endpoint: ClickHouseHttpEndpoint, counts: tuple[int, int, int]) -> None:
    assert endpoint._server is not None
    deadline = time.monotonic() + 5
    while endpoint._server.slots.reclaimable() != counts and time.monotonic() < deadline:
        time.sleep(0.01)
    assert endpoint._server.slots.reclaimable() == counts


def _read_response(sock: socket.socket) -> bytes:
    """One whole HTTP response (headers and Content-Length body): they may arrive in separate segments."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        chunk = sock.recv(4096)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


def test_a_newcomer_never_cuts_off_a_logged_in_clients_next_request(fake) -> None:  # noqa: ANN001
    """urllib3 reuses a pooled connection: its next request's headers are on their way when a newcomer arrives."""
    endpoint, _ = fake  # max_connections=3
    before = _handler_threads()
    req = (f"POST / HTTP/1.1\r\nHost: 127.0.0.1:{endpoint.port}\r\nAuthorization: {basic(ADMIN, ADMIN_PW)}\r\n"
           "Content-Length: 8\r\n\r\nSELECT 1").encode()
    client = socket.create_connection(("127.0.0.1", endpoint.port))
    client.settimeout(5)
    client.sendall(req)
    assert _read_response(client).startswith(b"HTTP/1.1 200 ")
    time.sleep(0.05)
    silent = [socket.create_connection(("127.0.0.1", endpoint.port)) for _ in range(2)]  # connected, sent nothing
    newcomer: socket.socket | None = None
    try:
        _wait_for_threads(before + 3)
        _wait_for_reclaimable(endpoint, (2, 0, 1))  # two silent connections; the client idle between requests
        client.sendall(req[:40])  # the client's next request is under way: it is no longer reclaimable
        _wait_for_reclaimable(endpoint, (2, 0, 0))
        newcomer = socket.create_connection(("127.0.0.1", endpoint.port))  # every slot taken: one must give way
        newcomer.settimeout(5)
        newcomer.sendall(b"GET /ping HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n" % endpoint.port)
        assert newcomer.recv(4096).startswith(b"HTTP/1.1 200 ")
        client.sendall(req[40:])
        assert _read_response(client).startswith(b"HTTP/1.1 200 "), "the logged-in client's request was cut off"
        silent[0].settimeout(2)
        assert silent[0].recv(10) == b"", "the silent connection accepted first gave way"
        silent[1].settimeout(0.2)
        with pytest.raises(TimeoutError):
            silent[1].recv(10)
    finally:
        for conn in [client, *silent, *([newcomer] if newcomer else [])]:
            conn.close()


# --- the real engine, in its own process, as `clocktower up` starts it ---------------------------------------

@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, dict[str, tuple[str, bool]]]]:
    data_dir = tmp_path_factory.mktemp("auth")
    ensure_secrets(data_dir)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "clocktower.sinks.endpoint", "--data-dir", str(data_dir / "clickhouse"),
         "--port", str(port),
         "--credentials", str(credentials_path(data_dir))],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("serving "), line + proc.stdout.read()
        yield port, read_users(credentials_path(data_dir))
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_clickhouse_connect_logs_in_with_the_generated_users(served) -> None:  # noqa: ANN001
    port, users = served
    with pytest.raises(DatabaseError, match="AUTHENTICATION_FAILED") as caught:
        clickhouse_connect.get_client(host="127.0.0.1", port=port, username=ADMIN_USER, password="guess")
    assert "516" in str(caught.value)
    with pytest.raises(DatabaseError, match="AUTHENTICATION_FAILED"):
        clickhouse_connect.get_client(host="127.0.0.1", port=port)  # "default", no password: no such user
    admin = clickhouse_connect.get_client(host="127.0.0.1", port=port, username=ADMIN_USER,
                                          password=users[ADMIN_USER][0])
    admin.command("CREATE TABLE auth_t (a Int8) ENGINE = MergeTree ORDER BY a")
    admin.insert("auth_t", [[1], [2]], column_names=["a"])
    reader = clickhouse_connect.get_client(host="127.0.0.1", port=port, username=DASHBOARDS_USER,
                                           password=users[DASHBOARDS_USER][0])
    assert reader.command("SELECT sum(a) FROM auth_t") == 3
    for sql in ("DROP TABLE auth_t", "INSERT INTO auth_t VALUES (3)", "CREATE TABLE x (a Int8) ENGINE = Memory"):
        with pytest.raises(DatabaseError, match="READONLY"):
            reader.command(sql)
    with pytest.raises(DatabaseError):
        reader.command("DROP TABLE auth_t", settings={"readonly": 0})  # the role wins over the client's settings
    assert admin.command("SELECT count() FROM auth_t") == 2


def test_the_endpoint_refuses_to_start_without_credentials(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "CLOCKTOWER_CREDENTIALS_FILE"}
    argv = [sys.executable, "-m", "clocktower.sinks.endpoint", "--data-dir", str(tmp_path / "ch"),
            "--port", str(free_port())]
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.startswith("error: no credentials file"), done.stderr
    done = subprocess.run([*argv, "--credentials", str(tmp_path / "missing.json")], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.startswith("error: cannot read"), done.stderr
    assert not (tmp_path / "ch").exists(), "the engine started before the credentials were checked"
