"""Attacks on what runs today (issue 8), as regression tests: each one worked before its fix.

The embedded ClickHouse endpoint (items 1-4): reading or writing files through table functions, a
second statement hidden in a heredoc or after VALUES data, a SET that stuck to the shared engine, a
slow read holding inserts, unbounded bodies and quadratic INSERT parsing.

The clock probes (item 7):
- Forgery: a node without the key claiming "node-0" with a 20 us bias moved an offset estimate by half
  the bias. Now every one of its datagrams is dropped and counted, and no event carries its pairs.
- Amplification: one 59-byte probe from a spoofed source made the agent send 404 datagrams there in
  13 s. Now probe-back sends a listed peer no more datagrams than it sent us.
- Exhaustion: anyone could fill the 64 probe-back slots and the 65,536-entry pending-pair table. Now
  only listed, authenticated sources create state, and pending pairs are bounded per sender.

The probe tests run on loopback: Linux delivers the whole of 127.0.0.0/8 locally, so a test socket bound
to 127.0.0.5 sends datagrams with that (spoofed) source and receives what the agent sends back there.
"""

from __future__ import annotations

import base64
import collections
import io
import os
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import clickhouse_connect
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clocktower.actuators.malformed import MAX_IDS, named_commands
from clocktower.producers.clock import wire
from clocktower.producers.clock.admission import Admission
from clocktower.producers.clock.key import ClockKeyError, generate_key_file, load_key
from clocktower.producers.clock.probe_agent import ProbeAgent, ProbeAgentConfig
from clocktower.producers.clock.replay import ReplayGuard, SendClock
from clocktower.runtime.rate_limit import TokenBucket
from clocktower.schemas.telemetry import ClockProbe
from clocktower.sinks.endpoint import ChdbEngine, ClickHouseError, ClickHouseHttpEndpoint, sql_guard
from clocktower.sinks.endpoint import protocol as protocol_module
from clocktower.sinks.endpoint.auth import User
from clocktower.sinks.endpoint.engine import escape_param
from clocktower.sinks.endpoint.limits import EndpointLimits
from clocktower.sinks.endpoint.protocol import ClickHouseProtocol
from clocktower.sinks.endpoint.request_body import RequestBody
from clocktower.sinks.endpoint.request_params import parse_params
from clocktower.sinks.endpoint.settings_allowed import SETTINGS_ALLOWED
from clocktower.sinks.endpoint.sql_guard import (
    FUNCTIONS_DENIED,
    TABLE_FUNCTIONS_ALLOWED,
    TABLE_FUNCTIONS_NOT_NEEDED,
    check_setting,
    check_table_setting,
)
from clocktower.sinks.endpoint.sql_scan import describe

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


# -- review findings: settings are allow-listed, never outlive their request, and headers have a deadline ---


FILE_LIKE = ("path", "file", "schema", "dir", "url")


def test_every_file_like_setting_is_refused(endpoint: ClickHouseHttpEndpoint) -> None:
    # A new chdb release adds settings: only those on the allow-list pass, so none that names a file can.
    where = " OR ".join(f"name ILIKE '%{word}%'" for word in FILE_LIKE)
    status, body = http(endpoint, f"SELECT name FROM system.settings WHERE {where}")
    names = body.decode().split()
    assert status == 200 and "output_format_schema" in names and "input_format_record_errors_file_path" in names
    for name in names:
        with pytest.raises(ClickHouseError, match="ACCESS_DENIED"):
            check_setting(name, "/tmp/x", cap_s=1)
    status, body = http(endpoint, "SELECT lower(name) FROM system.settings")
    assert set(body.decode().split()) >= SETTINGS_ALLOWED, "an allowed setting the engine does not know (a typo?)"
    status, body = http(endpoint, "SELECT name FROM system.merge_tree_settings WHERE name ILIKE '%disk%' "
                                  "OR name ILIKE '%path%' OR name ILIKE '%policy%'")
    assert status == 200 and b"storage_policy" in body
    for name in body.decode().split():
        with pytest.raises(ClickHouseError, match="ACCESS_DENIED"):
            check_table_setting(name)


def test_settings_cannot_write_files(endpoint: ClickHouseHttpEndpoint, tmp_path: Path) -> None:
    proto, errors = tmp_path / "x.proto", tmp_path / "errs"
    http(endpoint, "CREATE TABLE rec (a Int64) ENGINE = MergeTree ORDER BY a")
    select = "SELECT 1 AS a FORMAT Protobuf"
    attempts = [
        (http, {"get": select, "output_format_schema": str(proto)}),
        (http, {"sql": select, "output_format_schema": str(proto)}),
        (http, {"get": f"SELECT 1 AS a SETTINGS output_format_schema = '{proto}' FORMAT Protobuf"}),
        (http, {"sql": f"SELECT 1 AS a SETTINGS output_format_schema = '{proto}' FORMAT Protobuf"}),
        (http, {"sql": f"SELECT * FROM (SELECT 1 AS a SETTINGS output_format_schema = '{proto}') FORMAT Protobuf"}),
        (http, {"sql": "INSERT INTO rec SETTINGS input_format_allow_errors_num = 5, "
                       f"input_format_record_errors_file_path = '{errors}' FORMAT CSV\nattacker text\n1\n"}),
        (http, {"sql": "INSERT INTO rec FORMAT CSV\nattacker text\n1\n", "input_format_allow_errors_num": "5",
                "input_format_record_errors_file_path": str(errors)}),
        (http, {"sql": "SELECT 1", "dialect": "kusto"}),
        (http, {"get": "SELECT 1 SETTINGS dialect = 'prql'"}),
    ]
    for send, kwargs in attempts:
        status, body = send(endpoint, **kwargs)
        assert status == 403 and b"(ACCESS_DENIED)" in body, (kwargs, body)
    assert not proto.exists() and not errors.exists()
    assert admin_count(endpoint, "rec") == 0
    assert http(endpoint, get="SELECT 1 AS a", output_format_json_quote_64bit_integers="1", max_result_rows="5",
                session_timezone="UTC", date_time_output_format="iso") == (200, b"1\n")


def test_introspection_functions_are_off(endpoint: ClickHouseHttpEndpoint) -> None:
    # chdb starts its sessions with allow_introspection_functions=1: they map the process's memory to symbols.
    for kwargs in ({"get": "SELECT demangle('_Z1fv')"}, {"sql": "SELECT addressToSymbol(toUInt64(1))"}):
        status, body = http(endpoint, **kwargs)
        assert status != 200 and b"FUNCTION_NOT_ALLOWED" in body, (kwargs, body)
    status, body = http(endpoint, get="SELECT demangle('_Z1fv')", allow_introspection_functions="1")
    assert status == 403 and b"(ACCESS_DENIED)" in body


def test_a_request_cannot_break_the_writers_sessions(endpoint: ClickHouseHttpEndpoint,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # Even a setting that leaves a session unable to run SQL (the parser dialect, were it allowed) must not
    # outlive its request: the session is reset at once, or closed and replaced.
    monkeypatch.setattr(sql_guard, "SETTINGS_ALLOWED", SETTINGS_ALLOWED | {"dialect"})
    http(endpoint, "CREATE TABLE unbroken (a Int64) ENGINE = MergeTree ORDER BY a")
    for dialect in ("kusto", "prql", "kusto"):
        http(endpoint, "SELECT 1", dialect=dialect)
        http(endpoint, "INSERT INTO unbroken FORMAT CSV\n7\n", dialect=dialect)
    for i in range(3):  # sink-style inserts, each on whichever writer session the pool hands out
        status, body = http(endpoint, f"INSERT INTO unbroken FORMAT CSV\n{i}\n")
        assert status == 200, body
    assert http(endpoint, "SELECT name FROM system.settings WHERE changed AND name = 'dialect'") == (200, b"")
    assert admin_count(endpoint, "unbroken") >= 3


def test_treeless_statements_carry_no_settings(endpoint: ClickHouseHttpEndpoint) -> None:
    inner = "SELECT (SELECT sum(sipHash64(number)) FROM numbers(4e10)) AS x"
    started = time.monotonic()
    for sql in [f"DESCRIBE ({inner}) SETTINGS max_execution_time = 0", f"DESCRIBE ({inner} SETTINGS max_threads = 1)",
                "SHOW CREATE TABLE system.one SETTINGS output_format_schema = '/tmp/x'"]:
        status, body = http(endpoint, sql)
        assert status == 403 and b"may not carry SETTINGS" in body, (sql, body)
    assert time.monotonic() - started < 2
    assert http(endpoint, "DESCRIBE (SELECT 1 AS x)") == (200, b"x\tUInt8\t\t\t\t\t\n")


@pytest.fixture
def small_endpoint(endpoint: ClickHouseHttpEndpoint) -> Iterator[ClickHouseHttpEndpoint]:
    """A second listener on the same engine: 4 connection slots, a 1 s header deadline."""
    users = {ADMIN[0]: User(ADMIN[1], readonly=False)}
    server = ClickHouseHttpEndpoint(endpoint.engine, port=0, users=users, max_connections=4, header_timeout_s=1.0)
    server.start()
    yield server
    server.stop()


def test_slowloris_cannot_lock_anyone_out(small_endpoint: ClickHouseHttpEndpoint) -> None:
    slow = [socket.create_connection(("127.0.0.1", small_endpoint.port)) for _ in range(4)]
    try:
        for conn in slow:
            conn.sendall(b"G")  # a request has begun, and will never finish
        time.sleep(0.2)
        for _ in range(3):  # every slot holds a slowloris, yet logged-in clients are served at once
            started = time.monotonic()
            assert http(small_endpoint, "SELECT 1") == (200, b"1\n")
            assert time.monotonic() - started < 1.0
        trickle = socket.create_connection(("127.0.0.1", small_endpoint.port))
        slow.append(trickle)
        trickle.settimeout(0.3)
        started, closed = time.monotonic(), False
        while time.monotonic() - started < 4 and not closed:
            try:
                trickle.sendall(b"G")  # a byte well within every per-read timeout
                closed = trickle.recv(100) == b""
            except TimeoutError:
                continue
            except OSError:
                closed = True
        assert closed and time.monotonic() - started < 2.5, "a trickling request outlived the header deadline"
    finally:
        for conn in slow:
            conn.close()


def test_inserts_split_after_comments_and_into_a_table_named_settings(endpoint: ClickHouseHttpEndpoint) -> None:
    assert http(endpoint, "CREATE TABLE settings (a Int64) ENGINE = MergeTree ORDER BY a")[0] == 200
    for sql in ["INSERT INTO settings --note\nVALUES (1)", "INSERT INTO settings FORMAT CSV\n2\n",
                "INSERT INTO settings SETTINGS async_insert = 0 VALUES (3)",
                "INSERT INTO default.settings (a) VALUES (4)",
                "INSERT INTO settings /* c */ SETTINGS insert_deduplicate = 1 -- note\nFORMAT CSV\n5\n"]:
        status, body = http(endpoint, sql)
        assert status == 200, (sql, body)
    assert admin_count(endpoint, "settings") == 5


def test_errors_do_not_show_the_spool_path(endpoint: ClickHouseHttpEndpoint) -> None:
    http(endpoint, "CREATE TABLE spool_err (a Int64) ENGINE = MergeTree ORDER BY a")
    status, body = http(endpoint, "INSERT INTO spool_err FORMAT CSV\nnot a number\n")
    assert status == 400 and b"(INCORRECT_DATA)" in body
    spool_dir = ClickHouseProtocol(endpoint.engine).spool_dir.encode()
    assert spool_dir not in body and b"clocktower-insert-" not in body and b"<request body>" in body, body


def test_query_id_and_timezone_cannot_inject_response_headers(endpoint: ClickHouseHttpEndpoint) -> None:
    auth = "Basic " + base64.b64encode(f"{ADMIN[0]}:{ADMIN[1]}".encode()).decode()
    for param in ("query_id", "session_timezone"):
        url = endpoint.url + "/?" + urllib.parse.urlencode({"query": "SELECT 1", param: "x\r\nX-Injected: yes"})
        request = urllib.request.Request(url, headers={"Authorization": auth})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code == 400 and "X-Injected" not in refused.value.headers, param
        assert "\r" not in refused.value.headers["X-ClickHouse-Query-Id"]
    assert http(endpoint, get="SELECT 1", query_id="my-query 1") == (200, b"1\n")  # printable ASCII ids still work


# -- review findings: the raw query log stays out of reach, and no statement hides from the view ---------------
RAW = "system.query_log_raw"
RAW_LEAK_ATTACKS = [  # (statement, URL parameters): each read the raw log, or part of it, before its fix
    ("SELECT query FROM system.{t:Identifier} LIMIT 3", {"param_t": "query_log_raw"}),
    ("SELECT count() FROM {d:Identifier}.{t:Identifier}", {"param_d": "system", "param_t": "query_log_raw"}),
    ("SELECT count() FROM system.{t:Identifier}", {"param_t": "Query\\x5FLog\\x5FRaw"}),
    ("SELECT count() FROM {t:Identifier}", {"param_t": "system.query_log_raw"}),
    ("SELECT count() FROM system.{t:Identifier}", {"param_t": "`query\\x5Cx5Flog\\x5Fraw`"}),
    ("DESCRIBE format(JSONEachRow, (SELECT concat('{\"', replaceAll(arrayStringConcat(groupArray(query), '|'), "
     f"'\"', ''), '\":1}}') FROM {RAW}))", {}),
    ("DESCRIBE format(JSONEachRow, (SELECT concat('{\"', arrayStringConcat(groupArray(toString(number)), ''), "
     "'\":1}') FROM loop('system', concat('query_log', '_raw')) LIMIT 1))", {}),
    ("DESCRIBE format(JSONEachRow, (SELECT concat('{\"', toString(count()), '\":1}') "
     "FROM merge('system', '^query_log')))", {}),
    (f"DESCRIBE TABLE {RAW}", {}),
    (f"SHOW CREATE TABLE {RAW}", {}),
    ("SELECT * FROM loop('system', concat('query_log', '_raw')) LIMIT 1", {}),
    ("WITH concat('query_log', '_raw') AS t SELECT * FROM loop(system, t) LIMIT 1", {}),
    ("SELECT * FROM loop(merge('system', '^query_log')) LIMIT 1", {}),
    ("SELECT * FROM loop('system', {t:String}) LIMIT 1", {"param_t": "one"}),
    ("SELECT * FROM mergeTreeIndex('system', concat('query_log', '_raw')) LIMIT 3", {}),
    ("SELECT * FROM mergeTreeProjection('system', concat('query_log', '_raw'), 'p') LIMIT 3", {}),
]


@pytest.mark.parametrize(("sql", "params"), RAW_LEAK_ATTACKS)
@pytest.mark.parametrize("login", [ADMIN, VIEWER], ids=["admin", "viewer"])
def test_the_raw_query_log_stays_out_of_reach(endpoint: ClickHouseHttpEndpoint, sql: str, params: dict[str, str],
                                              login: tuple[str, str]) -> None:
    """Query parameters, DESCRIBE, SHOW CREATE and table functions that name a table by an expression."""
    http(endpoint, "SELECT 'raw-log-secret'")
    status, body = http(endpoint, get=sql, login=login, **params)
    assert status == 403 and b"ACCESS_DENIED" in body and b"raw-log-secret" not in body, (sql, status, body)


def test_what_the_raw_log_checks_leave_alone(endpoint: ClickHouseHttpEndpoint) -> None:
    for sql, params, expected in [
        ("SELECT count() FROM system.{t:Identifier}", {"param_t": "one"}, b"1\n"),
        ("SELECT {s:String}", {"param_s": "query_log"}, b"query_log\n"),
        ("DESCRIBE format(JSONEachRow, '{\"a\": 1}')", {}, b"a\tNullable(Int64)\t\t\t\t\t\n"),
        ("DESCRIBE TABLE system.one", {}, b"dummy\tUInt8\t\t\t\t\t\n"),
    ]:
        assert http(endpoint, get=sql, login=VIEWER, **params) == (200, expected), sql
    assert http(endpoint, "SELECT * FROM loop('system', 'one') LIMIT 2") == (200, b"0\n0\n")  # not at readonly=1


def test_treeless_statements_write_no_files(endpoint: ClickHouseHttpEndpoint, tmp_path: Path) -> None:
    """``DESCRIBE t INTO OUTFILE`` wrote a file: the guard judged statements without a tree by their calls only."""
    http(endpoint, "CREATE TABLE IF NOT EXISTS treeless_probe (x UInt8) ENGINE = MergeTree ORDER BY x")
    for n, sql in enumerate(["DESCRIBE treeless_probe INTO OUTFILE '{}'", "DESC (SELECT 1) INTO OUTFILE '{}'",
                             "SHOW CREATE TABLE treeless_probe INTO OUTFILE '{}'",
                             "EXISTS TABLE system.one INTO OUTFILE '{}'",
                             "SHOW COLUMNS FROM system.one INTO OUTFILE '{}'"]):
        target = tmp_path / f"out{n}.txt"
        status, body = http(endpoint, sql.format(target))
        assert status == 403 and b"OUTFILE" in body and not target.exists(), (sql, body)
    assert http(endpoint, "SHOW COLUMNS FROM system.one")[0] == 200


def test_no_client_statement_hides_from_the_query_log(endpoint: ClickHouseHttpEndpoint) -> None:
    """The view once left out any statement that began like the endpoint's own (SELECT parseQueryToJSON(...)."""
    shown = ["SELECT parseQueryToJSON('SELECT 1') AS a, 'hide-1-marker'",
             "SELECT formatQuery('SELECT 1'), 'hide-2-marker'", "SELECT 'clocktower-session-flush', 'hide-3-marker'"]
    for sql in shown:
        assert http(endpoint, get=sql, login=VIEWER)[0] == 200, sql
    for sql in ("SELECT 'clocktower-session-flush'", " SELECT 'clocktower-session-flush' ;"):
        status, body = http(endpoint, get=sql, login=VIEWER)
        assert status == 403 and b"ACCESS_DENIED" in body, body
    query = ("SELECT uniqExact(extract(query, 'hide-[0-9]-marker')) FROM system.query_log "
             "WHERE type = 'QueryFinish' AND query LIKE '%hide-_-marker%' AND query NOT LIKE '%query_log%'")
    deadline, seen = time.monotonic() + 20, b""
    while seen != b"3\n" and time.monotonic() < deadline:
        time.sleep(0.2)
        seen = http(endpoint, get=query, login=VIEWER)[1]
    assert seen == b"3\n"
    own = ("SELECT count() FROM system.query_log WHERE startsWith(query, 'SELECT parseQueryToJSON(') "
           "AND position(query, 'hide-1-marker') = 0")
    status, body = http(endpoint, get=own, login=VIEWER)
    assert (status, body) == (200, b"0\n")  # the guard's own parses stay out, at readonly=1 too


# --- the clock probes (item 7) ---------------------------------------------------------


REPO = Path(__file__).resolve().parents[1]
KEY = b"cluster key for the probe security tests (test only)"
WRONG_KEY = b"a forger's guess at the key, also 32 bytes or more"
BIAS_NS = 20_000
RATE = 50.0


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@contextmanager
def _udp(host: str, port: int = 0) -> Iterator[socket.socket]:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.bind((host, port))
        s.setblocking(False)
        yield s
    finally:
        s.close()


def _wait(condition: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def _drain(s: socket.socket) -> list[bytes]:
    out = []
    while True:
        try:
            out.append(s.recv(2048))
        except BlockingIOError:
            return out


def _v1_probe(sender: str, pair_id: int, idx: int, tx_ns: int) -> bytes:
    """The pre-fix wire format (version 1, no MAC), exactly as the forger of the issue sent it."""
    name = sender.encode()
    return struct.pack(">4sBBBBQq", b"CTCK", 1, 1, idx, len(name), pair_id, tx_ns) + name


def _v1_follow_up(sender: str, pair_id: int, tx0: int, tx1: int) -> bytes:
    name = sender.encode()
    return (struct.pack(">4sBBBBH", b"CTCK", 1, 2, 0, len(name), 1) + name
            + struct.pack(">QqqB", pair_id, tx0, tx1, 3))


def _agent(node: str, port: int, peers: tuple[str, ...], sink: Callable[[list[ClockProbe]], object],
           **kwargs: object) -> ProbeAgent:
    config = ProbeAgentConfig(node=node, key=KEY, bind=f"127.0.0.1:{port}", peers=peers, pairs_per_s=RATE,
                              flush_interval_s=0.1, **kwargs)  # type: ignore[arg-type]
    return ProbeAgent(config, sink).start()


# -- forgery --------------------------------------------------------------------------------------------------

def test_a_forger_without_the_key_claiming_node0_moves_nothing() -> None:
    """Genuine node-0 and node-1 probe each other while a forger, without the key, sends node-0 pairs whose
    follow-ups claim a TX time 20 us late (so the delay looks 20 us shorter), both in the old unsigned format
    and MACed with a wrong key, from node-0's IP and from an unlisted one. Before the fix this moved the
    offset estimate by ~10 us; now every forged datagram is counted as dropped and no event is forged."""
    p0, p1 = _free_port(), _free_port()
    at0: list[ClockProbe] = []
    at1: list[ClockProbe] = []
    node1 = _agent("node-1", p1, (f"127.0.0.1:{p0}",), at1.extend)
    node0 = _agent("node-0", p0, (f"127.0.0.1:{p1}",), at0.extend)
    forged_ids: set[int] = set()
    sent = collections.Counter[str]()
    stamps = SendClock()
    try:
        with _udp("127.0.0.1") as same_ip, _udp("127.0.0.9") as elsewhere:
            target = ("127.0.0.1", p1)
            deadline = time.monotonic() + 2.0
            pair_id = 0xF0F0_0000_0000_0000
            while time.monotonic() < deadline:
                pair_id += 1
                forged_ids.add(pair_id)
                tx0 = time.time_ns()
                biased = (tx0 + BIAS_NS, tx0 + BIAS_NS + 1_000)
                unsigned = [_v1_probe("node-0", pair_id, 0, tx0), _v1_probe("node-0", pair_id, 1, tx0),
                            _v1_follow_up("node-0", pair_id, *biased)]
                wrong = [wire.encode_probe(wire.Probe("node-0", pair_id, i, stamps.stamp()), WRONG_KEY) for i in (0, 1)]
                wrong.append(wire.encode_follow_up(wire.FollowUp(
                    "node-0", 0, (wire.FollowUpEntry(pair_id, *biased),), stamps.stamp()), WRONG_KEY))
                for data in unsigned:
                    same_ip.sendto(data, target)
                    sent["malformed"] += 1
                for data in wrong:
                    same_ip.sendto(data, target)
                    sent["bad_mac"] += 1
                for data in unsigned + wrong:
                    elsewhere.sendto(data, target)
                    sent["unlisted_source"] += 1
                time.sleep(1 / RATE)
        assert _wait(lambda: sum(node1.stats()["counts"].get(k, 0) for k in sent) >= sum(sent.values()), 5)
    finally:
        node0.stop()
        node1.stop()
    counts = node1.stats()["counts"]
    assert {k: counts.get(k, 0) for k in sent} == dict(sent), counts
    assert not forged_ids & {e.pair_id for e in at1}, "a forged pair became an event"
    assert len(at1) >= 2 * RATE and len(at0) >= 2 * RATE          # the genuine exchange went on
    d01 = min(e.rx_ns - e.tx_ns for e in at1)
    d10 = min(e.rx_ns - e.tx_ns for e in at0)
    offset = (d01 - d10) / 2
    assert abs(offset) < BIAS_NS / 8, f"offset estimate {offset} ns moved (true offset 0)"


def test_replayed_and_stale_datagrams_are_dropped() -> None:
    """A valid datagram sent twice, or one stamped outside the replay window, is counted and not used."""
    p1 = _free_port()
    with _udp("127.0.0.1") as sender:
        at1: list[ClockProbe] = []
        node1 = _agent("node-1", p1, (f"127.0.0.1:{sender.getsockname()[1]}",), at1.extend, probe_back=False,
                       replay_window_s=5.0)
        try:
            now = time.time_ns()
            probes = [wire.encode_probe(wire.Probe("node-0", 7, i, now + i), KEY) for i in (0, 1)]
            follow = wire.encode_follow_up(wire.FollowUp("node-0", 0, (wire.FollowUpEntry(7, now, now + 1),),
                                                         now + 2), KEY)
            stale = wire.encode_probe(wire.Probe("node-0", 8, 0, now - 60 * 10**9), KEY)
            for data in (*probes, follow, probes[0], follow, stale):
                sender.sendto(data, ("127.0.0.1", p1))
            assert _wait(lambda: node1.stats()["counts"].get("stale", 0) == 1, 5)
            assert _wait(lambda: len(at1) == 2, 5)
        finally:
            node1.stop()
    counts = node1.stats()["counts"]
    assert counts["replayed"] == 2 and counts["stale"] == 1 and counts["pairs_joined"] == 1
    assert sorted(e.idx for e in at1) == [0, 1] and {e.pair_id for e in at1} == {7}


# -- amplification --------------------------------------------------------------------------------------------

def test_one_spoofed_probe_from_a_listed_address_gets_no_amplification() -> None:
    """One valid probe from a listed peer's address (that peer runs no agent: the source is spoofed) used to
    make the agent probe that address back at full rate for 10 s (~375x). Now it sends at most as many
    datagrams as it received."""
    victim_port = _free_port("127.0.0.5")
    p1 = _free_port()
    with _udp("127.0.0.5", victim_port) as victim:
        node1 = _agent("node-1", p1, (f"127.0.0.5:{victim_port}",), lambda events: None, probe_peers=0)
        try:
            probe = wire.encode_probe(wire.Probe("node-0", 99, 0, time.time_ns()), KEY)
            victim.sendto(probe, ("127.0.0.1", p1))
            assert _wait(lambda: node1.stats()["probed_back"] == 1, 5)
            time.sleep(2.0)                             # 100 pairs' worth at 50 pairs/s
            got = _drain(victim)
        finally:
            node1.stop()
    counts = node1.stats()["counts"]
    assert len(got) <= 1 and sum(map(len, got)) <= len(probe), \
        f"{len(got)} datagrams ({sum(map(len, got))} bytes) sent back for one {len(probe)}-byte probe"
    assert counts["probe_back_no_credit"] >= 20                 # ~100 pairs were due; a stall may skip some


def test_probe_back_goes_only_to_listed_host_and_port() -> None:
    """A valid probe from a listed IP but an unlisted port is used, but never probed back."""
    listed, p1 = _free_port(), _free_port()
    with _udp("127.0.0.1") as other_port:
        node1 = _agent("node-1", p1, (f"127.0.0.1:{listed}",), lambda events: None, probe_peers=0)
        try:
            other_port.sendto(wire.encode_probe(wire.Probe("node-0", 5, 0, time.time_ns()), KEY), ("127.0.0.1", p1))
            assert _wait(lambda: node1.stats()["counts"].get("probe_back_unlisted", 0) == 1, 5)
            time.sleep(0.3)
            assert _drain(other_port) == [] and node1.stats()["probed_back"] == 0
        finally:
            node1.stop()


# -- exhaustion -----------------------------------------------------------------------------------------------

def test_unauthenticated_floods_take_no_slot_and_no_table_entry() -> None:
    """Probes from 150 unlisted sources, and 1000 distinct pairs MACed with a wrong key from a listed IP,
    take no probe-back slot and leave no pending pair (before: 64 slots and the 65,536-entry table filled).
    1150 datagrams fit in the agent's socket buffer, so none is lost even if the agent is slow to read."""
    listed, p1 = _free_port(), _free_port()
    node1 = _agent("node-1", p1, (f"127.0.0.1:{listed}",), lambda events: None, probe_peers=0)
    try:
        now = time.time_ns()
        for i in range(150):
            with _udp(f"127.0.{1 + i // 200}.{10 + i % 200}") as spoofed:
                spoofed.sendto(wire.encode_probe(wire.Probe(f"n{i}", i, 0, now + i), KEY), ("127.0.0.1", p1))
        with _udp("127.0.0.1") as same_ip:
            for i in range(1000):
                same_ip.sendto(wire.encode_probe(wire.Probe("node-0", i, 0, now + i), WRONG_KEY), ("127.0.0.1", p1))
        assert _wait(lambda: node1.stats()["counts"].get("bad_mac", 0) + node1.stats()["counts"].get(
            "unlisted_source", 0) >= 1150, 10)
        stats = node1.stats()
    finally:
        node1.stop()
    assert stats["counts"]["unlisted_source"] == 150 and stats["counts"]["bad_mac"] == 1000
    assert stats["probed_back"] == 0 and stats["pending_pairs"] == 0 and stats["peers"] == []
    assert "probes_received" not in stats["counts"]


def test_a_flooding_key_holder_is_rate_limited_and_cannot_fill_the_pending_table() -> None:
    """A listed node with the key floods distinct pair ids: its token bucket drops most (what it lets through
    stays within burst + rate x time, whatever the kernel dropped), its pending pairs stay under the
    per-sender bound, and another node's pairs are still joined meanwhile."""
    flood_port, p0, p1 = _free_port(), _free_port(), _free_port()
    at1: list[ClockProbe] = []
    node1 = _agent("node-1", p1, (f"127.0.0.1:{flood_port}", f"127.0.0.1:{p0}"), at1.extend, probe_peers=0,
                   max_pending_per_sender=100)
    node0 = _agent("node-0", p0, (f"127.0.0.1:{p1}",), lambda events: None)
    stamps = SendClock()
    try:
        assert _wait(lambda: len(at1) >= 10, 5)
        received_before = node1.stats()["counts"]["probes_received"]
        t0 = time.monotonic()
        with _udp("127.0.0.1", flood_port) as flooder:
            for i in range(4000):
                flooder.sendto(wire.encode_probe(wire.Probe("flooder", i, 0, stamps.stamp()), KEY), ("127.0.0.1", p1))
                if i % 100 == 99:
                    time.sleep(0.01)                    # at most ~10,000 datagrams/s, 20x the default limit
            before = len(at1)
            assert _wait(lambda: node1.stats()["counts"].get("rate_limited", 0) >= 1000, 5)
            time.sleep(0.2)
            stats = node1.stats()
            elapsed = time.monotonic() - t0
            assert _wait(lambda: len(at1) >= before + 20, 5), "node-0's pairs stopped being joined"
    finally:
        node0.stop()
        node1.stop()
    limit = node1.config.datagrams_per_s                          # burst = one second's worth
    let_in = stats["counts"]["probes_received"] - received_before
    assert let_in <= limit + limit * elapsed + 2 * RATE * elapsed + 10, (let_in, elapsed)   # + node-0's own
    assert stats["pending_pairs"] <= 100 + 2 * RATE               # the flooder's bound + node-0's in flight
    assert {e.sender for e in at1} == {"node-0"}


def test_pending_pairs_are_bounded_per_sender() -> None:
    """With the rate limit out of the way, one sender's half-joined pairs stop at max_pending_per_sender."""
    flood_port, p1 = _free_port(), _free_port()
    node1 = _agent("node-1", p1, (f"127.0.0.1:{flood_port}",), lambda events: None, probe_peers=0,
                   max_pending_per_sender=50, max_datagrams_per_s=1e6, probe_back=False)
    stamps = SendClock()
    try:
        with _udp("127.0.0.1", flood_port) as flooder:
            for i in range(500):
                flooder.sendto(wire.encode_probe(wire.Probe("flooder", i, 0, stamps.stamp()), KEY), ("127.0.0.1", p1))
            assert _wait(lambda: node1.stats()["counts"].get("probes_received", 0) >= 500, 5)
            stats = node1.stats()
    finally:
        node1.stop()
    assert stats["pending_pairs"] == 50 and stats["counts"]["pending_sender_overflow"] == 450


# -- the pieces, without sockets ------------------------------------------------------------------------------

def test_replay_guard_accepts_new_stamps_once_and_tolerates_small_reordering() -> None:
    now = 1_700_000_000 * 10**9
    g = ReplayGuard(window_ns=10**9, keep=4)
    assert g.check("a", now, now) is None
    assert g.check("a", now, now) == "replayed"
    assert g.check("a", now + 3, now) is None
    assert g.check("a", now + 2, now) is None                    # reordered, still new: accepted once
    assert g.check("a", now + 2, now) == "replayed"
    assert g.check("a", now - 1, now) == "replayed"              # older than anything remembered
    assert g.check("b", now, now) is None                        # per sender
    assert g.check("a", now + 2 * 10**9, now) == "stale"
    assert g.check("a", now - 2 * 10**9, now) == "stale"
    for i in range(4, 10):
        assert g.check("a", now + i, now) is None
    assert g.check("a", now + 3, now) == "replayed"              # fell out of the 4 kept: too old to tell
    small = ReplayGuard(window_ns=10**9, max_senders=2)
    for sender in "xyz":
        small.check(sender, now, now)
    assert len(small) == 2
    clock = SendClock()
    stamps = [clock.stamp() for _ in range(1000)]
    assert stamps == sorted(set(stamps))                          # strictly increasing


def test_token_bucket() -> None:
    b = TokenBucket(rate=10, burst=5, now_ns=0)
    assert [b.take(0) for _ in range(6)] == [True] * 5 + [False]
    assert b.take(100_000_000) and not b.take(100_000_000)       # 0.1 s refills one token
    assert sum(b.take(10**9 + i) for i in range(20)) == 5         # never more than the burst


def test_admission_checks_source_then_mac_and_keeps_no_state_for_refusals() -> None:
    counts: collections.Counter[str] = collections.Counter()
    adm = Admission(KEY, [("10.0.0.2", 7373)], 10**10, rate_per_s=100, burst=2, counts=counts)
    good = wire.encode_probe(wire.Probe("n2", 1, 0, time.time_ns()), KEY)
    assert adm.admit(good, ("10.0.0.3", 7373)) is None                       # unlisted IP: not even decoded
    assert adm.admit(good[:-1] + bytes([good[-1] ^ 1]), ("10.0.0.2", 7373)) is None
    assert adm.admit(b"junk", ("10.0.0.2", 7373)) is None
    assert len(adm._replay) == 0 and not adm._buckets                        # nothing kept for any of them
    assert adm.admit(good, ("10.0.0.2", 7373)) == wire.decode(good, KEY)
    assert adm.admit(good, ("10.0.0.2", 7373)) is None                       # the same datagram again
    assert adm.listed(("10.0.0.2", 7373)) and not adm.listed(("10.0.0.2", 7374))
    for i in range(2, 6):
        adm.admit(wire.encode_probe(wire.Probe("n2", i, 0, time.time_ns()), KEY), ("10.0.0.2", 7373), now_ns=0)
    assert counts == {"unlisted_source": 1, "bad_mac": 1, "malformed": 1, "replayed": 1, "rate_limited": 3}


# -- the key file ---------------------------------------------------------------------------------------------

def test_key_files_are_generated_private_and_checked(tmp_path: Path) -> None:
    path = generate_key_file(tmp_path / "clock.key")
    assert path.stat().st_mode & 0o777 == 0o600 and len(load_key(path)) == 64
    assert generate_key_file(tmp_path / "other.key").read_bytes() != path.read_bytes()   # random, not built in
    with pytest.raises(ClockKeyError, match="already exists"):
        generate_key_file(path)
    with pytest.raises(ClockKeyError, match="does not exist"):
        load_key(tmp_path / "missing")
    link = tmp_path / "link.key"
    link.symlink_to(path)
    with pytest.raises(ClockKeyError, match="symlink"):
        load_key(link)
    with pytest.raises(ClockKeyError, match="symlink|exists"):
        generate_key_file(link)
    short = tmp_path / "short.key"
    short.write_bytes(b"x" * 31)
    short.chmod(0o600)
    with pytest.raises(ClockKeyError, match="31 bytes"):
        load_key(short)
    path.chmod(0o640)
    with pytest.raises(ClockKeyError, match="chmod 600"):
        load_key(path)
    path.chmod(0o600)
    if os.geteuid() == 0:                       # only root can give a file to another user
        os.chown(path, 4321, 4321)
        with pytest.raises(ClockKeyError, match="owned by uid 4321"):
            load_key(path)


def test_the_standalone_agent_refuses_to_run_without_a_key(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "CLOCKTOWER_CLOCK_KEY_FILE"}
    cmd = [sys.executable, "-m", "clocktower.producers.clock.probe_agent", "--node", "a", "--duration", "0.2"]
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "no clock key" in r.stderr
    r = subprocess.run(cmd + ["--gen-key", str(tmp_path / "k")], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and len(load_key(tmp_path / "k")) == 64
    r = subprocess.run(cmd + ["--bind", "0.0.0.0:0"], cwd=REPO, capture_output=True, text=True, timeout=60,
                       env={**env, "CLOCKTOWER_CLOCK_KEY_FILE": str(tmp_path / "k")})
    assert r.returncode == 2 and "every interface" in r.stderr


# -- issue 18: what a local user with no keys could still do ------------------------------------------------------

def test_a_malformed_command_record_naming_many_ids_gets_few_acks() -> None:
    """One malformed record naming 100 command ids got 100 refused acks: each forged record was an amplifier."""
    record = orjson.dumps([{"command_id": f"forged-{i}", "node": "node-a", "action": "failover"} for i in range(100)])
    named = named_commands(record, "node-a")
    assert len(named) == MAX_IDS <= 4
    assert [n.command_id for n in named] == [f"forged-{i}" for i in range(MAX_IDS)]


def test_the_cli_believes_only_an_ack_the_node_signed(tmp_path: Path) -> None:
    """`clocktower control release` printed "applied" and exited 0 for a forged, unsigned ack (with the producer
    key set, the node's MAC is checked)."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from clocktower.control_cli import _ack_reader, _wait_ack
    from clocktower.producers.kafka_publisher import KafkaPublisher
    from clocktower.schemas.codec import encode_batch
    from clocktower.schemas.control import ControlAck, ControlCommand
    from clocktower.schemas.record_mac import check, node_key
    from tests.standalone_broker import running

    producer_key = b"k" * 32
    cmd = ControlCommand(node="node-a", ts_ns=time.time_ns(), command_id="operator-release-1", action="release",
                         target="eth0", expires_ns=time.time_ns() + 60 * 10**9, signature="x")

    def ack(status: str) -> ControlAck:
        return ControlAck(node="node-a", ts_ns=time.time_ns(), command_id=cmd.command_id, status=status,
                          detail=f"{status} by whoever sent it", action="release", target="eth0")

    with running(tmp_path / "kafka") as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic("control.acks", 1, 1)])["control.acks"].result(10)
        reader = _ack_reader(broker.bootstrap, {})
        forger = Producer({"bootstrap.servers": broker.bootstrap})
        key, value, headers = encode_batch([ack("applied")])
        forger.produce("control.acks", key=key, value=value, headers=headers)   # no ct-node-mac
        assert forger.flush(10) == 0
        node = KafkaPublisher(broker.bootstrap, node_key=node_key(producer_key, "node-a"))
        node.publish([ack("refused")])
        assert node.producer.flush(10) == 0
        ignored: list[str] = []
        got = _wait_ack(reader, cmd, 15, partial(check, producer_key), ignored)
        assert got is not None and got.status == "refused", "the forged 'applied' ack was believed"
        assert ignored == ["record is not signed (ct-node-mac header missing)"]
        reader.close()


SMUGGLING = {   # the first request's framing headers; its body, then a second request, follow on the connection
    "CL and TE": "Content-Length: {n}\r\nTransfer-Encoding: chunked\r\n",
    "two Content-Lengths": "Content-Length: 5\r\nContent-Length: {n}\r\n",
    "xchunked": "Transfer-Encoding: xchunked\r\n",
    "chunked, then identity": "Transfer-Encoding: chunked, identity\r\n",
    "a signed length": "Content-Length: +{n}\r\n",
}


@pytest.mark.parametrize("framing", SMUGGLING)
def test_ambiguous_framing_is_refused_and_nothing_is_smuggled(endpoint: ClickHouseHttpEndpoint, framing: str) -> None:
    """Issue 18: a request hidden in the body of one with ambiguous framing was run as a second request."""
    auth = "Basic " + base64.b64encode(f"{ADMIN[0]}:{ADMIN[1]}".encode()).decode()
    host = f"127.0.0.1:{endpoint.port}"
    smuggled = (f"GET /?query=SELECT%20424242 HTTP/1.1\r\nHost: {host}\r\nAuthorization: {auth}\r\n\r\n").encode()
    body = b"0\r\n\r\n" + smuggled
    head = (f"POST /?query=SELECT%201 HTTP/1.1\r\nHost: {host}\r\nAuthorization: {auth}\r\n"
            + SMUGGLING[framing].format(n=len(body)) + "\r\n").encode()
    with socket.create_connection(("127.0.0.1", endpoint.port), timeout=10) as conn:
        conn.sendall(head + body)
        answer = b""
        while chunk := conn.recv(65536):   # the server closes the connection after its one answer
            answer += chunk
    assert answer.startswith(b"HTTP/1.") and answer.split(b" ", 2)[1] == b"400", answer[:300]
    assert answer.count(b"HTTP/1.") == 1 and b"424242" not in answer, answer


def test_plain_chunked_and_sized_requests_still_work(endpoint: ClickHouseHttpEndpoint) -> None:
    auth = "Basic " + base64.b64encode(f"{ADMIN[0]}:{ADMIN[1]}".encode()).decode()
    for framing, body, want in (("Transfer-Encoding: Chunked\r\n", b"8\r\nSELECT 7\r\n0\r\n\r\n", b"7\n"),
                                ("Content-Length: 8\r\nContent-Length: 8\r\n", b"SELECT 8", b"8\n")):
        head = (f"POST / HTTP/1.1\r\nHost: 127.0.0.1:{endpoint.port}\r\nAuthorization: {auth}\r\n"
                f"Connection: close\r\n{framing}\r\n")
        with socket.create_connection(("127.0.0.1", endpoint.port), timeout=10) as conn:
            conn.sendall(head.encode() + body)
            answer = b""
            while chunk := conn.recv(65536):
                answer += chunk
        assert answer.split(b" ", 2)[1] == b"200" and answer.endswith(b"\r\n\r\n" + want), answer
