"""Attacks on the embedded ClickHouse endpoint (issue 8, items 1-4), as regression tests.

Each test replays an attack that worked before the guard: reading or writing files through
table functions, a second statement hidden in a heredoc or after VALUES data, a SET that stuck
to the shared engine, a slow read holding inserts, unbounded bodies and quadratic INSERT parsing.
"""

from __future__ import annotations

import base64
import io
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import clickhouse_connect
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sinks.endpoint import ChdbEngine, ClickHouseError, ClickHouseHttpEndpoint
from sinks.endpoint import protocol as protocol_module
from sinks.endpoint.auth import User
from sinks.endpoint.engine import escape_param
from sinks.endpoint.limits import EndpointLimits
from sinks.endpoint.protocol import ClickHouseProtocol
from sinks.endpoint.request_body import RequestBody
from sinks.endpoint.request_params import parse_params
from sinks.endpoint.sql_guard import FUNCTIONS_DENIED, TABLE_FUNCTIONS_ALLOWED, TABLE_FUNCTIONS_NOT_NEEDED
from sinks.endpoint.sql_scan import describe

ADMIN, VIEWER = ("admin", "admin-pass"), ("viewer", "viewer-pass")
LIMITS = EndpointLimits(
    read_timeout_s=2, write_timeout_s=4, max_query_bytes=256 << 10, max_insert_bytes=4 << 20, queue_timeout_s=10
)


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClickHouseHttpEndpoint]:
    engine = ChdbEngine(tmp_path_factory.mktemp("chdb"), LIMITS)
    users = {ADMIN[0]: User(ADMIN[1], readonly=False), VIEWER[0]: User(VIEWER[1], readonly=True)}
    server = ClickHouseHttpEndpoint(engine, port=0, users=users)
    server.start()
    yield server
    server.stop()
    engine.close()


def http(
    endpoint: ClickHouseHttpEndpoint, sql: str | bytes | None = None, get: str | None = None,
    login: tuple[str, str] = ADMIN, timeout: float = 30, **params: str,
) -> tuple[int, bytes]:
    """POST ``sql`` as the body, or GET with ``get`` as the query; ``params`` go in the URL."""
    query = dict(params, **({"query": get} if get is not None else {}))
    url = endpoint.url + "/?" + urllib.parse.urlencode(query)
    body = sql.encode() if isinstance(sql, str) else sql
    auth = "Basic " + base64.b64encode(f"{login[0]}:{login[1]}".encode()).decode()
    request = urllib.request.Request(url, data=body, headers={"Authorization": auth})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as ex:
        return ex.code, ex.read()


def admin_count(endpoint: ClickHouseHttpEndpoint, table: str) -> int:
    status, body = http(endpoint, f"SELECT count() FROM {table}")
    assert status == 200, body
    return int(body)


def table_exists(endpoint: ClickHouseHttpEndpoint, table: str) -> bool:
    status, body = http(endpoint, f"EXISTS TABLE {table}")
    assert status == 200, body
    return body.strip() == b"1"


# -- item 1: nothing reaches files, the network or other processes ----------------------------------


READ_ATTACKS = [
    "SELECT * FROM file('/etc/passwd')",
    "SELECT * FROM file('/etc/passwd', 'LineAsString')",
    "select * from FILE('/etc/passwd', 'LineAsString')",
    "SELECT file('/etc/passwd')",
    "SELECT * FROM `file`('/etc/passwd', 'LineAsString')",
    "SELECT * FROM view(SELECT * FROM file('/etc/passwd', 'LineAsString'))",
    "WITH x AS (SELECT * FROM file('/etc/passwd', 'LineAsString')) SELECT * FROM x",
    "SELECT 1 WHERE 1 IN (SELECT length(line) FROM file('/etc/passwd', 'LineAsString'))",
    "DESCRIBE TABLE file('/etc/passwd', 'LineAsString')",
    "SELECT * FROM filesystem('/etc')",
    "SELECT * FROM executable('id', 'TSV', 'a String')",
    "SELECT * FROM python(x)",
    "SELECT * FROM remote('127.0.0.1', system.one)",
    "SELECT * FROM s3('http://127.0.0.1:1/b/k', 'TSV', 'a String')",
    "SELECT * FROM sqlite('/etc/passwd', 't')",
]


@pytest.mark.parametrize("sql", READ_ATTACKS)
@pytest.mark.parametrize("how", ["GET", "POST", "viewer"])
def test_file_and_network_table_functions_are_denied(endpoint: ClickHouseHttpEndpoint, sql: str, how: str) -> None:
    if how == "GET":
        status, body = http(endpoint, get=sql)
    else:
        status, body = http(endpoint, sql, login=VIEWER if how == "viewer" else ADMIN)
    assert status == 403 and b"(ACCESS_DENIED)" in body, body
    assert b"root:" not in body


def test_url_pointed_back_at_the_endpoint_is_denied_at_once(endpoint: ClickHouseHttpEndpoint) -> None:
    back = f"{endpoint.url}/?query=SELECT+sleep(3)"
    started = time.monotonic()
    status, body = http(endpoint, get=f"SELECT * FROM url('{back}', 'TSV', 'a String')")
    assert status == 403 and b"Function url is not allowed" in body
    assert time.monotonic() - started < 2


def test_files_cannot_be_written(endpoint: ClickHouseHttpEndpoint, tmp_path: Path) -> None:
    out, func = tmp_path / "outfile", tmp_path / "function"
    attacks = [
        f"SELECT 1 INTO OUTFILE '{out}'",
        f"SELECT 1 INTO OUTFILE '{out}' APPEND",
        f"INSERT INTO FUNCTION file('{func}', 'TSV', 'a String') VALUES ('x')",
        f"INSERT INTO FUNCTION file('{func}', 'TSV', 'a String') FORMAT TSV\nx\n",
        f"INSERT INTO FUNCTION file('{func}', 'TSV', 'a String') SELECT 'x'",
        f"CREATE TABLE wf (a String) ENGINE = File(TSV, '{func}')",
        f"BACKUP TABLE system.one TO File('{func}')",
        f"CREATE TABLE wd (a Int8) ENGINE = MergeTree ORDER BY a SETTINGS disk = disk(type='local', path='{out}/')",
        "CREATE DATABASE fs ENGINE = Filesystem('/')",
        "CREATE DICTIONARY dp (a String) PRIMARY KEY a SOURCE(FILE(path '/etc/passwd' format 'TSV')) "
        "LAYOUT(COMPLEX_KEY_HASHED()) LIFETIME(0)",
        "CREATE DICTIONARY dx (a String) PRIMARY KEY a SOURCE(EXECUTABLE(command 'id' format 'TSV')) "
        "LAYOUT(COMPLEX_KEY_HASHED()) LIFETIME(0)",
        f"ATTACH TABLE wa FROM '{tmp_path}' (a Int8) ENGINE = Log",
        "CREATE TEMPORARY TABLE tmp (a Int8)",
        "SYSTEM SHUTDOWN",
    ]
    for sql in attacks:
        status, body = http(endpoint, sql)
        assert status == 403 and b"(ACCESS_DENIED)" in body, (sql, body)
    assert not out.exists() and not func.exists()
    assert not table_exists(endpoint, "wf") and not table_exists(endpoint, "wd")


def test_values_data_cannot_call_functions(endpoint: ClickHouseHttpEndpoint) -> None:
    http(endpoint, "CREATE TABLE vals (s String) ENGINE = MergeTree ORDER BY s")
    status, body = http(endpoint, "INSERT INTO vals VALUES (file('/etc/hostname'))")
    assert status != 200, body
    assert http(endpoint, "INSERT INTO vals VALUES ('plain'), ('it''s')")[0] == 200  # literals still work
    assert http(endpoint, "SELECT groupArray(s) FROM (SELECT s FROM vals ORDER BY s)") == (200, b"['it\\'s','plain']\n")


def test_every_engine_table_function_is_classified(endpoint: ClickHouseHttpEndpoint) -> None:
    # A new chdb release may add table functions: each must be allowed on purpose or denied in every position.
    status, body = http(endpoint, "SELECT name FROM system.table_functions")
    names = {n.lower() for n in body.decode().split()}
    assert status == 200 and "file" in names
    assert names - TABLE_FUNCTIONS_ALLOWED - FUNCTIONS_DENIED - TABLE_FUNCTIONS_NOT_NEEDED == set()
    status, body = http(endpoint, "SELECT * FROM mergeTreeTextIndex(system, one)")
    assert status == 403 and b"Table function mergeTreeTextIndex is not allowed" in body


# -- item 1: one statement per request ----------------------------------------------------------------


SMUGGLED = [
    "SELECT $$'$$; DROP TABLE {t}; SELECT $$'$$",
    "SELECT $x$'$x$; DROP TABLE {t}; SELECT $x$'$x$",
    "SELECT '\\''; DROP TABLE {t}; SELECT '\\''",
    "SELECT 1 /* /* */ ; DROP TABLE {t}; SELECT 1 /* */",
    "SELECT 1 -- ;\n; DROP TABLE {t}",
    "INSERT INTO {t} VALUES (1); DROP TABLE {t}",
    "INSERT INTO {t} VALUES (1);\nDROP TABLE {t}",
    "INSERT INTO {t} FORMAT Values (1); DROP TABLE {t}",
    "INSERT INTO {t} SELECT 1; DROP TABLE {t}",
]


@pytest.mark.parametrize("attack", SMUGGLED)
def test_a_second_statement_never_runs(endpoint: ClickHouseHttpEndpoint, attack: str) -> None:
    table = f"victim_{abs(hash(attack)) % 10**8}"
    assert http(endpoint, f"CREATE TABLE {table} (a Int64) ENGINE = MergeTree ORDER BY a")[0] == 200
    http(endpoint, attack.format(t=table))
    http(endpoint, get=attack.format(t=table))
    assert table_exists(endpoint, table), attack


FRAGMENTS = ["'", '"', "`", "$$", "$a$", ";", "/*", "*/", "--", "#", "# ", "\n", "\\", "1", " ", "x", "''"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.sampled_from(FRAGMENTS), max_size=12))
def test_tokenizer_agrees_with_the_engine_on_statement_count(endpoint: ClickHouseHttpEndpoint,
                                                             parts: list[str]) -> None:
    text = ("SELECT 1 " + "".join(parts) + " ; SELECT 2").encode()
    try:
        endpoint.engine.execute("SELECT formatQuery({q:String})", params={"q": escape_param(text)})
        engine_multi = False
    except ClickHouseError as ex:
        if "Multi-statements" not in ex.message:
            return  # not valid SQL either way: the engine refuses it whatever we think
        engine_multi = True
    assert describe(text).multi_statement == engine_multi


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=200))
def test_statements_reach_the_parser_byte_for_byte(endpoint: ClickHouseHttpEndpoint, raw: bytes) -> None:
    result = endpoint.engine.execute("SELECT {q:String}", "RawBLOB", params={"q": escape_param(raw)})
    assert result.data == raw


# -- the read-only role and item 2: nothing sticks to the shared engine --------------------------------


def test_set_and_use_never_stick(endpoint: ClickHouseHttpEndpoint) -> None:
    http(endpoint, "CREATE TABLE sticky (a Int64) ENGINE = MergeTree ORDER BY a")
    changed = "SELECT name FROM system.settings WHERE changed AND name IN ('readonly', 'max_result_rows')"
    for attack in ["SET readonly = 1", "SET max_result_rows = 1", "USE system"]:
        assert http(endpoint, get=attack)[0] == 200  # sessionless HTTP: a SET or USE changes nothing
        assert http(endpoint, attack)[0] == 200
        assert http(endpoint, "INSERT INTO sticky VALUES (1)")[0] == 200, attack
        assert http(endpoint, "SELECT currentDatabase()") == (200, b"default\n")
        assert http(endpoint, changed) == (200, b"")
        assert http(endpoint, get=changed) == (200, b"readonly\n")  # GETs run at readonly=2
    assert admin_count(endpoint, "sticky") == 3


def test_viewer_is_really_readonly(endpoint: ClickHouseHttpEndpoint) -> None:
    http(endpoint, "CREATE TABLE ro (a Int64) ENGINE = MergeTree ORDER BY a")
    form = ("--b\r\nContent-Disposition: form-data; name=\"readonly\"\r\n\r\n0\r\n"
            "--b\r\nContent-Disposition: form-data; name=\"query\"\r\n\r\nINSERT INTO ro VALUES (7)\r\n--b--\r\n")
    attempts = [
        ("INSERT INTO ro VALUES (1)", {}),
        ("INSERT INTO ro VALUES (1)", {"readonly": "0"}),
        ("INSERT INTO ro SETTINGS readonly = 0 VALUES (1)", {}),
        ("CREATE TABLE ro2 (a Int8) ENGINE = Memory", {"readonly": "0"}),
        ("SET readonly = 0", {}),
        ("SET max_threads = 1", {}),
        ("USE system", {}),
        ("SELECT 1 SETTINGS readonly = 0", {}),
        ("SELECT 1 SETTINGS max_result_rows = 5", {}),
        ("SELECT 1", {"max_result_rows": "5"}),
        ("KILL QUERY WHERE 1", {}),
    ]
    for sql, params in attempts:
        status, body = http(endpoint, sql, login=VIEWER, **params)
        assert status == 403 and b"(READONLY)" in body or b"(ACCESS_DENIED)" in body, (sql, params, body)
    auth = "Basic " + base64.b64encode(f"{VIEWER[0]}:{VIEWER[1]}".encode()).decode()
    request = urllib.request.Request(endpoint.url + "/", data=form.encode(), headers={
        "Authorization": auth, "Content-Type": "multipart/form-data; boundary=b"})
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=10)
    assert caught.value.code == 403
    assert admin_count(endpoint, "ro") == 0 and not table_exists(endpoint, "ro2")
    # Grafana sends max_execution_time with every query: accepted within the cap, refused above it.
    assert http(endpoint, "SELECT 1", login=VIEWER, max_execution_time="1") == (200, b"1\n")
    status, body = http(endpoint, "SELECT 1", login=VIEWER, max_execution_time="1000")
    assert status == 400 and b"SETTING_CONSTRAINT_VIOLATION" in body
    assert http(endpoint, "SELECT count() FROM ro", login=VIEWER) == (200, b"0\n")
    assert http(endpoint, "INSERT INTO ro VALUES (1)")[0] == 200  # the admin still writes afterwards
    viewer = clickhouse_connect.get_client(host="127.0.0.1", port=endpoint.port, username=VIEWER[0],
                                           password=VIEWER[1])
    assert viewer.command("SELECT count() FROM ro") == 1


# -- item 3: time limits, insert priority, body size ---------------------------------------------------


SLOW = "SELECT sleepEachRow(0.2) FROM numbers(50) SETTINGS max_block_size = 1"  # 10 s without a limit
HEAVY = "SELECT sum(sipHash64(number)) FROM numbers(100000000000)"  # minutes without a limit


@pytest.mark.parametrize("login, sql", [(ADMIN, SLOW), (VIEWER, HEAVY)], ids=["writer", "viewer"])
def test_max_execution_time_stops_long_queries(endpoint: ClickHouseHttpEndpoint, login: tuple[str, str],
                                               sql: str) -> None:
    started = time.monotonic()
    status, body = http(endpoint, sql, login=login)
    assert b"(TIMEOUT_EXCEEDED)" in body and status >= 400, body
    assert time.monotonic() - started < LIMITS.read_timeout_s + 2.5


def test_clients_may_lower_the_time_limit_but_not_raise_it(endpoint: ClickHouseHttpEndpoint) -> None:
    status, body = http(endpoint, SLOW, max_execution_time="1000")
    assert status == 400 and b"SETTING_CONSTRAINT_VIOLATION" in body
    status, body = http(endpoint, SLOW.replace("max_block_size = 1", "max_block_size = 1, max_execution_time = 0"))
    assert status == 400 and b"SETTING_CONSTRAINT_VIOLATION" in body
    started = time.monotonic()
    status, body = http(endpoint, SLOW, max_execution_time="0.5")
    assert b"(TIMEOUT_EXCEEDED)" in body and time.monotonic() - started < 1.5


def test_slow_reads_do_not_hold_inserts(endpoint: ClickHouseHttpEndpoint) -> None:
    http(endpoint, "CREATE TABLE prio (a Int64) ENGINE = MergeTree ORDER BY a")
    readers = [threading.Thread(target=http, args=(endpoint, SLOW), kwargs={"login": login})
               for login in (ADMIN, ADMIN, ADMIN, VIEWER, VIEWER)]
    readers.append(threading.Thread(target=http, args=(endpoint,), kwargs={"get": SLOW}))
    for thread in readers:
        thread.start()
    time.sleep(0.5)  # every session but the insert-only one is busy sleeping now
    started = time.monotonic()
    for i in range(3):
        assert http(endpoint, f"INSERT INTO prio VALUES ({i})")[0] == 200
    elapsed = time.monotonic() - started
    for thread in readers:
        thread.join()
    assert elapsed < 1.0, f"inserts waited {elapsed:.2f} s behind slow reads"
    assert admin_count(endpoint, "prio") == 3


def test_bodies_are_bounded(endpoint: ClickHouseHttpEndpoint) -> None:
    http(endpoint, "CREATE TABLE big_body (a String) ENGINE = MergeTree ORDER BY a")
    status, body = http(endpoint, "SELECT '" + "x" * (LIMITS.max_query_bytes + 1) + "'")
    assert status == 413 and b"(QUERY_IS_TOO_LARGE)" in body
    row = b"y" * 1023 + b"\n"
    status, body = http(endpoint, b"INSERT INTO big_body FORMAT TSV\n" + row * (LIMITS.max_insert_bytes // 1024 + 1))
    assert status == 413 and b"(QUERY_IS_TOO_LARGE)" in body
    assert admin_count(endpoint, "big_body") == 0
    assert http(endpoint, b"INSERT INTO big_body FORMAT TSV\n" + row * 1000)[0] == 200
    assert admin_count(endpoint, "big_body") == 1000


# -- item 4: INSERT parsing is linear ------------------------------------------------------------------


def _chunked(data: bytes, size: int) -> bytes:
    pieces = [b"%x\r\n%s\r\n" % (len(data[i : i + size]), data[i : i + size]) for i in range(0, len(data), size)]
    return b"".join(pieces) + b"0\r\n\r\n"


def _handle(endpoint: ClickHouseHttpEndpoint, body: bytes, chunk: int, query: str = "") -> None:
    request = RequestBody(io.BytesIO(_chunked(body, chunk)), {"Transfer-Encoding": "chunked"})
    params = parse_params([("query", query)] if query else [])
    ClickHouseProtocol(endpoint.engine).handle("POST", params, request, "")


def test_insert_head_is_scanned_a_bounded_number_of_times(endpoint: ClickHouseHttpEndpoint,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    http(endpoint, "CREATE TABLE linear (a Int64) ENGINE = MergeTree ORDER BY a")
    scanned: list[int] = []
    real = protocol_module.split_insert

    def counting(buf: bytes, complete: bool) -> object:
        scanned.append(len(buf))
        return real(buf, complete)

    monkeypatch.setattr(protocol_module, "split_insert", counting)
    data = b"".join(b"%d\n" % i for i in range(400_000))  # ~2.6 MiB
    _handle(endpoint, b"INSERT INTO linear FORMAT TSV\n" + data, chunk=4096)
    assert len(scanned) <= 2 and sum(scanned) <= 2 * LIMITS.insert_head_bytes
    scanned.clear()
    _handle(endpoint, data, chunk=4096, query="INSERT INTO linear FORMAT TSV")
    assert len(scanned) <= 2 and sum(scanned) <= 2 * LIMITS.insert_head_bytes
    assert admin_count(endpoint, "linear") == 800_000
    scanned.clear()
    with pytest.raises(ClickHouseError, match="QUERY_IS_TOO_LARGE"):  # no FORMAT within the head: refused
        _handle(endpoint, b"INSERT INTO linear " + b"x" * (3 << 20), chunk=1024)
    assert len(scanned) <= 2 and sum(scanned) <= 2 * LIMITS.insert_head_bytes
