"""ClickHouse HTTP details that curl, clickhouse-connect and Grafana rely on (issue 9, item 9).

HEAD health checks, the X-ClickHouse-Format / X-ClickHouse-Database request headers, response
compression (enable_http_compression) and system.query_log, each checked with a real client against
a real endpoint.
"""

from __future__ import annotations

import base64
import bz2
import gzip
import http.client
import json
import lzma
import os
import shutil
import socket
import subprocess
import time
import zlib
from collections.abc import Callable, Iterator

import clickhouse_connect
import pytest
from clickhouse_connect.driver.compression import available_compression

from clocktower.sinks.endpoint import ChdbEngine, ClickHouseHttpEndpoint, response_encoding
from clocktower.sinks.endpoint.auth import User
from clocktower.sinks.endpoint.http_server import UNAUTHENTICATED_DRAIN_LIMIT
from clocktower.sinks.endpoint.limits import EndpointLimits
from clocktower.sinks.endpoint.request_body import _READ_SIZE, _lz4_frame, _zstd

USER, PASSWORD = "compat", "a-compat-password"
VIEWER = "viewer"
BASIC = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
NUMBERS = b"".join(b"%d\n" % i for i in range(1000))
REPEATS = b"".join(b"%d\n" % (i % 7) for i in range(1000))
DECODERS: dict[str, Callable[[bytes], bytes]] = {
    "gzip": gzip.decompress,
    "deflate": zlib.decompress,
    "xz": lzma.decompress,
    "bz2": bz2.decompress,
}
if _zstd is not None:
    DECODERS["zstd"] = _zstd.decompress
if _lz4_frame is not None:
    DECODERS["lz4"] = _lz4_frame.decompress


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClickHouseHttpEndpoint]:
    engine = ChdbEngine(tmp_path_factory.mktemp("chdb-compat"), EndpointLimits(query_log_flush_ms=200))
    users = {USER: User(PASSWORD, readonly=False), VIEWER: User(PASSWORD, readonly=True)}
    server = ClickHouseHttpEndpoint(engine, port=0, users=users)
    server.start()
    yield server
    server.stop()
    engine.close()


def request(endpoint: ClickHouseHttpEndpoint, method: str, path: str, conn: http.client.HTTPConnection | None = None,
            **headers: str) -> tuple[int, dict[str, str], bytes]:
    conn = conn or http.client.HTTPConnection("127.0.0.1", endpoint.port, timeout=10)
    conn.request(method, path, headers={"Authorization": BASIC, **headers})
    response = conn.getresponse()
    return response.status, dict(response.headers), response.read()


def test_head_answers_health_checks_without_a_body(endpoint: ClickHouseHttpEndpoint) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", endpoint.port, timeout=10)
    for path in ("/ping", "/", "/replicas_status"):
        conn.request("HEAD", path)  # no login: health checkers carry none
        response = conn.getresponse()
        assert (response.status, response.read()) == (200, b"")
        assert response.headers["Content-Length"] == "4"  # what GET would send
    status, _, body = request(endpoint, "GET", "/?query=SELECT+7", conn)  # the connection is still in step
    assert (status, body) == (200, b"7\n")
    conn.request("HEAD", "/no_such_handler")
    assert conn.getresponse().status == 404


def test_head_with_curl(endpoint: ClickHouseHttpEndpoint) -> None:
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed on this machine")
    done = subprocess.run(["curl", "-sS", "-I", "--max-time", "10", f"{endpoint.url}/ping"],
                          capture_output=True, text=True, timeout=20, check=True)
    assert done.stdout.startswith("HTTP/1.1 200")


def test_format_and_database_headers(endpoint: ClickHouseHttpEndpoint) -> None:
    status, headers, body = request(endpoint, "GET", "/?query=SELECT+1+AS+a", **{"X-ClickHouse-Format": "JSONEachRow"})
    assert (status, body) == (200, b'{"a":1}\n')
    assert headers["X-ClickHouse-Format"] == "JSONEachRow"
    assert headers["Content-Type"].startswith("application/x-ndjson")
    # The header wins over default_format, as in ClickHouse.
    _, _, body = request(endpoint, "GET", "/?default_format=CSV&query=SELECT+'x'+AS+a",
                         **{"X-ClickHouse-Format": "JSONCompactEachRow"})
    assert body == b'["x"]\n'
    _, _, body = request(endpoint, "GET", "/?query=SELECT+currentDatabase()", **{"X-ClickHouse-Database": "system"})
    assert body == b"system\n"
    _, _, body = request(endpoint, "GET", "/?database=default&query=SELECT+count()+FROM+one",
                         **{"X-ClickHouse-Database": "system"})
    assert body == b"1\n"


def test_response_headers_clients_read(endpoint: ClickHouseHttpEndpoint) -> None:
    status, headers, _ = request(endpoint, "GET", "/?query_id=q-compat-1&query=SELECT+1+FORMAT+JSON")
    assert status == 200
    assert headers["X-ClickHouse-Query-Id"] == "q-compat-1"
    assert headers["X-ClickHouse-Format"] == "JSON" and headers["Content-Type"].startswith("application/json")
    assert headers["X-ClickHouse-Timezone"]
    assert json.loads(headers["X-ClickHouse-Summary"])["read_rows"] == "1"
    for fmt, expected in (("TSVWithNames", "text/tab-separated-values"), ("CSVWithNamesAndTypes", "text/csv"),
                          ("JSONCompact", "application/json"), ("XML", "application/xml")):
        _, headers, _ = request(endpoint, "GET", f"/?query=SELECT+1+FORMAT+{fmt}")
        assert headers["X-ClickHouse-Format"] == fmt and headers["Content-Type"].startswith(expected), headers
    _, headers, _ = request(endpoint, "GET", "/?query=SELECT+1+FORMAT+CSVWithNamesAndTypes")
    assert "header=present" in headers["Content-Type"]
    status, headers, _ = request(endpoint, "GET", "/?query=SELECT+*+FROM+no_such_table")
    assert status == 404 and headers["X-ClickHouse-Exception-Code"] == "60" and headers["X-ClickHouse-Query-Id"]


@pytest.mark.parametrize("encoding", sorted(DECODERS))
def test_response_compression(endpoint: ClickHouseHttpEndpoint, encoding: str) -> None:
    query = "/?query=SELECT+number+%25+7+FROM+numbers(1000)"
    status, headers, body = request(endpoint, "GET", query + "&enable_http_compression=1",
                                    **{"Accept-Encoding": encoding})
    assert status == 200 and headers["Content-Encoding"] == encoding
    assert len(body) < len(REPEATS) // 4 and DECODERS[encoding](body) == REPEATS
    # The default is the engine's (chdb: on, as system.settings tells clickhouse-connect); =0 turns it off.
    _, headers, body = request(endpoint, "GET", query, **{"Accept-Encoding": encoding})
    assert headers["Content-Encoding"] == encoding and DECODERS[encoding](body) == REPEATS
    _, headers, body = request(endpoint, "GET", query + "&enable_http_compression=0", **{"Accept-Encoding": encoding})
    assert "Content-Encoding" not in headers and body == REPEATS
    _, headers, body = request(endpoint, "GET", query + "&enable_http_compression=1")  # nothing accepted
    assert "Content-Encoding" not in headers and body == REPEATS


def test_compression_follows_clickhouse_preference(endpoint: ClickHouseHttpEndpoint) -> None:
    assert response_encoding.choose("gzip, deflate") == "gzip"
    assert response_encoding.choose("deflate;q=1, gzip;q=0") == "deflate"
    assert response_encoding.choose("identity") is None
    if _zstd is not None:
        assert response_encoding.choose("gzip, deflate, br, zstd") == "zstd"  # curl --compressed
    _, headers, body = request(endpoint, "GET", "/?enable_http_compression=1&http_zlib_compression_level=9"
                               "&query=SELECT+number+FROM+numbers(1000)", **{"Accept-Encoding": "gzip"})
    assert headers["Content-Encoding"] == "gzip" and gzip.decompress(body) == NUMBERS
    status, _, _ = request(endpoint, "GET", "/?enable_http_compression=1&http_zlib_compression_level=99&query=SELECT+1")
    assert status == 400
    # Also allowed in a SETTINGS clause, as clients may write it there (it changes nothing in the engine).
    sql = "SELECT+1+SETTINGS+enable_http_compression=1,http_zlib_compression_level=5"
    assert request(endpoint, "GET", f"/?query={sql}")[::2] == (200, b"1\n")


def test_curl_compressed(endpoint: ClickHouseHttpEndpoint) -> None:
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed on this machine")
    url = f"{endpoint.url}/?enable_http_compression=1&query=SELECT+number+FROM+numbers(1000)"
    done = subprocess.run(["curl", "-sS", "--compressed", "-D", "-", "-u", f"{USER}:{PASSWORD}", "--max-time", "10",
                           url], capture_output=True, timeout=20, check=True)
    head, _, body = done.stdout.partition(b"\r\n\r\n")
    assert b"content-encoding:" in head.lower() and body == NUMBERS


@pytest.mark.parametrize("compress", ["gzip", "deflate", "zstd", "lz4", True])
def test_clickhouse_connect_gets_compressed_responses(
    endpoint: ClickHouseHttpEndpoint, compress: str | bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if compress in ("zstd", "lz4") and compress not in response_encoding.ENCODERS:
        pytest.skip(f"{compress} is not installed on this machine")
    sent: list[str] = []
    real = response_encoding.compress

    def spy(data: bytes, encoding: str, level: int | None = None) -> bytes:
        sent.append(encoding)
        return real(data, encoding, level)

    monkeypatch.setattr(response_encoding, "compress", spy)
    ch = clickhouse_connect.get_client(host="127.0.0.1", port=endpoint.port, username=USER, password=PASSWORD,
                                       compress=compress)
    assert ch.query("SELECT number FROM numbers(1000) ORDER BY number").result_columns[0] == list(range(1000))
    assert ch.query_arrow("SELECT toString(number) AS s FROM numbers(3)").column("s").to_pylist() == ["0", "1", "2"]
    assert sent, "the endpoint sent no compressed response"
    expected = compress if isinstance(compress, str) else response_encoding.choose(",".join(available_compression))
    assert set(sent) == {expected}


def test_query_log_keeps_client_queries_only(endpoint: ClickHouseHttpEndpoint) -> None:
    """Grafana's plugin and users read system.query_log; the endpoint's own statements and secrets stay out of it.

    Each role leaves its traces: the guard's parse (logged at readonly=1), SET/reset of per-request settings,
    and the sink's INSERT with its spool path and insert_deduplication_token.
    """
    admin = clickhouse_connect.get_client(host="127.0.0.1", port=endpoint.port, username=USER, password=PASSWORD)
    viewer = clickhouse_connect.get_client(host="127.0.0.1", port=endpoint.port, username=VIEWER, password=PASSWORD)
    assert admin.command("SELECT 'marker-admin-1'", settings={"max_execution_time": 7}) == "marker-admin-1"
    assert viewer.command("SELECT 'marker-viewer-1'") == "marker-viewer-1"
    with pytest.raises(clickhouse_connect.driver.exceptions.DatabaseError):  # a failed query flushes its session
        viewer.query("SELECT throwIf(1, 'marker-viewer-failed')")
    admin.command("CREATE TABLE IF NOT EXISTS log_probe (x UInt8) ENGINE = MergeTree ORDER BY x")
    admin.insert("log_probe", [[1]], column_names=["x"], settings={"insert_deduplication_token": "secret-salt-1"})
    query = ("SELECT query, type FROM system.query_log WHERE query LIKE '%marker-%-1%' AND query NOT LIKE '%query_log%'"
             " ORDER BY event_time_microseconds")
    rows: list[tuple[str, str]] = []
    deadline = time.monotonic() + 20
    while len(rows) < 4 and time.monotonic() < deadline:  # the log is flushed every 200 ms here
        time.sleep(0.2)
        rows = [tuple(row) for row in viewer.query(query).result_rows]  # the read-only role may read it
    finished = {q for q, kind in rows if kind == "QueryFinish"}
    assert any("marker-admin-1" in q for q in finished) and any("marker-viewer-1" in q for q in finished), rows
    assert all("parseQueryToJSON" not in q for q, _ in rows), rows
    inserts: list[tuple[str, str]] = []
    while not inserts and time.monotonic() < deadline:
        inserts = [tuple(r) for r in viewer.query("SELECT query, toString(Settings) FROM system.query_log "
                                                  "WHERE query LIKE 'INSERT INTO%log_probe%'").result_rows]
        time.sleep(0.2)
    assert inserts and all("<request body>" in q for q, _ in inserts), inserts
    everything = "\n".join(str(row) for row in viewer.query("SELECT * FROM system.query_log").result_rows)
    for leak in ("clocktower-insert-", "/dev/shm", "secret-salt-1", "parseQueryToJSON", "formatQuery({q",
                 "clocktower-session-flush", "= DEFAULT", "SET max_execution_time", "SET log_queries",
                 "SELECT name, value FROM system.settings"):
        assert leak not in everything, leak
    assert viewer.query("SELECT count() FROM system.query_log WHERE query_kind = 'Set'").result_rows == [(0,)]
    for client in (admin, viewer):  # the raw log, with all of the above, stays out of reach
        for sql in ("SELECT count() FROM system.query_log_raw", "SELECT count() FROM merge('system', '^query_log')",
                    "SELECT count() FROM view(SELECT * FROM system.QUERY_LOG_RAW)"):
            with pytest.raises(clickhouse_connect.driver.exceptions.DatabaseError, match="ACCESS_DENIED|not allowed"):
                client.query(sql)
    with pytest.raises(clickhouse_connect.driver.exceptions.DatabaseError, match="ACCESS_DENIED|not allowed"):
        admin.command("CREATE TABLE log_copy ENGINE = Merge(REGEXP('^sys'), '^query_l')")


def test_slow_encodings_stay_at_a_low_level() -> None:
    """Any reader may pick xz or bz2 and level 9: 4 MiB then took 100 MiB more memory and seconds of CPU."""
    data = NUMBERS * 50
    assert response_encoding.compress(data, "xz", 9) == lzma.compress(data, preset=response_encoding.SLOW_MAX_LEVEL)
    assert response_encoding.compress(data, "bz2", 9)[:4] == b"BZh%d" % response_encoding.SLOW_MAX_LEVEL
    for encoding in ("xz", "bz2"):
        assert DECODERS[encoding](response_encoding.compress(data, encoding, 9)) == data


def test_sessions_start_with_resource_caps_that_clients_cannot_raise(endpoint: ClickHouseHttpEndpoint) -> None:
    """Three pools of a dozen sessions share the machine: none may take every core or all memory."""
    limits = endpoint.protocol.engine.limits
    assert limits.max_threads <= max(1, (os.cpu_count() or 1) // 4) and limits.max_memory_usage > 0
    caps = "SELECT getSetting('max_threads'), getSetting('max_memory_usage')"
    for user in (USER, VIEWER):
        client = clickhouse_connect.get_client(host="127.0.0.1", port=endpoint.port, username=user, password=PASSWORD)
        assert client.query(caps).result_rows == [(limits.max_threads, limits.max_memory_usage)]
    admin = clickhouse_connect.get_client(host="127.0.0.1", port=endpoint.port, username=USER, password=PASSWORD)
    for settings in ({"max_threads": limits.max_threads + 1}, {"max_threads": 0}, {"max_memory_usage": 0}):
        with pytest.raises(clickhouse_connect.driver.exceptions.DatabaseError, match="SETTING_CONSTRAINT"):
            admin.query("SELECT 1", settings=settings)
    with pytest.raises(clickhouse_connect.driver.exceptions.DatabaseError, match="SETTING_CONSTRAINT"):
        admin.query(f"SELECT 1 SETTINGS max_threads = {limits.max_threads + 1}")
    assert admin.query("SELECT getSetting('max_threads')", settings={"max_threads": 1}).result_rows == [(1,)]


def test_resource_caps_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLOCKTOWER_ENDPOINT_MAX_THREADS", "3")
    monkeypatch.setenv("CLOCKTOWER_ENDPOINT_MAX_MEMORY_USAGE", "1000000")
    assert EndpointLimits().session_baseline() == {"max_threads": "3", "max_memory_usage": "1000000"}


@pytest.mark.parametrize("method, path", [("HEAD", "/ping"), ("HEAD", "/"), ("GET", "/ping"), ("POST", "/nowhere")])
def test_requests_without_login_drain_little(endpoint: ClickHouseHttpEndpoint, method: str, path: str) -> None:
    """Paths that need no login read at most UNAUTHENTICATED_DRAIN_LIMIT of a body, then close: not 256 MiB."""
    sent = UNAUTHENTICATED_DRAIN_LIMIT + _READ_SIZE  # all of it read: no reset that would drop the answer
    with socket.create_connection(("127.0.0.1", endpoint.port), timeout=5) as sock:
        host = f"127.0.0.1:{endpoint.port}"
        sock.sendall(f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {200 << 20}\r\n\r\n".encode())
        sock.sendall(b"x" * sent)  # far less than announced: a server that drains it all never answers
        head = sock.recv(4096).decode(errors="replace")
    assert head.startswith("HTTP/1.1 "), head
    assert "Connection: close" in head and " 403 " not in head, head
