"""The embedded ClickHouse HTTP endpoint, driven through the real clickhouse-connect HTTP client.

Other processes (the CLI, Grafana, sinks) reach the single chdb owner only
through this endpoint, so these tests use the same clients they do.
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import clickhouse_connect
import numpy as np
import pyarrow as pa
import pytest
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import DatabaseError

from clocktower.sinks.endpoint import ChdbEngine, ClickHouseHttpEndpoint, DataDirLocked, PortInUse
from clocktower.sinks.endpoint.auth import User
from clocktower.sinks.endpoint.sql_scan import NEED_MORE, InsertSplit, split_insert

REPO = Path(__file__).resolve().parents[1]
USER, PASSWORD = "tester", "a-test-password"
BASIC = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("chdb")


@pytest.fixture(scope="module")
def endpoint(data_dir: Path) -> Iterator[ClickHouseHttpEndpoint]:
    # chdb hosts one engine per process, so the whole module shares this one.
    engine = ChdbEngine(data_dir)
    server = ClickHouseHttpEndpoint(engine, port=0, users={USER: User(PASSWORD, readonly=False)})
    server.start()
    yield server
    server.stop()
    engine.close()


def client(endpoint: ClickHouseHttpEndpoint, compress: bool | str = False, **kwargs: object) -> Client:
    return clickhouse_connect.get_client(host="127.0.0.1", port=endpoint.port, compress=compress,
                                         username=USER, password=PASSWORD, **kwargs)


def http(
    endpoint: ClickHouseHttpEndpoint, path: str, body: bytes | None = None, **headers: str
) -> tuple[int, bytes]:
    request = urllib.request.Request(endpoint.url + path, data=body, headers={"Authorization": BASIC, **headers})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as ex:
        return ex.code, ex.read()


@pytest.mark.parametrize("compress", [False, True, "lz4", "zstd", "gzip"])
def test_clickhouse_connect_round_trip(endpoint: ClickHouseHttpEndpoint, compress: bool | str) -> None:
    table = f"rt_{str(compress).lower()}"
    ch = client(endpoint, compress)
    ch.command(f"CREATE TABLE {table} (id Int64, name String, ts DateTime64(9)) ENGINE = Memory")
    columns = [[1, 2], ["a", "b"], [10**18, 10**18 + 5]]
    ch.insert(table, columns, column_names=["id", "name", "ts"], column_oriented=True)
    ts = pa.array([1, 2], type=pa.timestamp("ns"))
    ch.insert_arrow(table, pa.table({"id": [3, 4], "name": ["c", "d"], "ts": ts}))
    assert ch.command(f"SELECT count() FROM {table}") == 4
    rows = ch.query(f"SELECT id, name FROM {table} WHERE id > {{x:Int64}} ORDER BY id", parameters={"x": 2})
    assert rows.result_rows == [(3, "c"), (4, "d")]
    arrow = ch.query_arrow(f"SELECT id, name FROM {table} ORDER BY id")
    assert arrow.column("id").to_pylist() == [1, 2, 3, 4]
    assert ch.query("SELECT {s:String} AS s", parameters={"s": "it's"}).result_rows == [("it's",)]
    assert ch.query(f"SELECT id, name FROM {table} WHERE 0").column_names == ("id", "name")


def test_insert_deduplication_token(endpoint: ClickHouseHttpEndpoint) -> None:
    ch = client(endpoint, "lz4")
    ch.command(
        "CREATE TABLE dedup (id Int64) ENGINE = MergeTree ORDER BY id "
        "SETTINGS non_replicated_deduplication_window = 100"
    )
    batch = pa.table({"id": [1, 2, 3]})
    for _ in range(2):
        ch.insert_arrow("dedup", batch, settings={"insert_deduplication_token": "batch-1"})
        ch.insert("dedup", [[7], [8]], ["id"], settings={"insert_deduplication_token": "batch-2"})
    assert ch.command("SELECT count() FROM dedup") == 5
    # The per-query setting did not stick to the engine: a tokenless insert is not deduplicated away.
    ch.insert_arrow("dedup", batch)
    assert ch.command("SELECT count() FROM dedup") == 8


def test_errors_are_clickhouse_shaped(endpoint: ClickHouseHttpEndpoint) -> None:
    ch = client(endpoint)
    with pytest.raises(DatabaseError, match="Code: 60") as caught:
        ch.query("SELECT * FROM no_such_table")
    assert caught.value.code == 60
    with pytest.raises(DatabaseError, match="Code: 62"):
        ch.command("SELEC 1")
    status, body = http(endpoint, "/?query=SELECT+*+FROM+no_such_table")
    assert status == 404 and body.startswith(b"Code: 60. DB::Exception: ") and b"(UNKNOWN_TABLE)" in body
    status, body = http(endpoint, "/", b"SELECT 1; SELECT 2")
    assert status == 400 and b"Multi-statements" in body
    status, body = http(endpoint, "/?compress=1", b"SELECT 1")
    assert status == 501 and b"(NOT_IMPLEMENTED)" in body
    status, body = http(endpoint, "/", b"SELECT 1", **{"Content-Encoding": "gzip"})
    assert status == 400 and b"CANNOT_DECOMPRESS" in body
    status, body = http(endpoint, "/", b"INSERT INTO t FROM INFILE '/etc/passwd' FORMAT CSV")
    assert status == 404 and b"(UNKNOWN_TYPE_OF_QUERY)" in body  # servers never read INFILE, as in ClickHouse
    with pytest.raises(DatabaseError, match="Code: 60"):
        ch.raw_insert("no_such_table", None, b"1\n" * 100_000, fmt="CSV")
    assert ch.command("SELECT 1") == 1  # the server survived all of it


def test_plain_http(endpoint: ClickHouseHttpEndpoint) -> None:
    assert http(endpoint, "/ping") == (200, b"Ok.\n")
    assert http(endpoint, "/?query=SELECT+1") == (200, b"1\n")
    assert http(endpoint, "/", b"SELECT 1 + 1") == (200, b"2\n")
    assert http(endpoint, "/?query=SELECT+{x:UInt8}*2&param_x=21") == (200, b"42\n")
    assert http(endpoint, "/?default_format=JSONEachRow", b"SELECT 1 AS a") == (200, b'{"a":1}\n')
    assert http(endpoint, "/", gzip.compress(b"SELECT 3"), **{"Content-Encoding": "gzip"}) == (200, b"3\n")
    status, body = http(endpoint, "/?query=CREATE+TABLE+nope+(a+Int8)+ENGINE=Memory")
    assert status == 403 and b"(READONLY)" in body  # GET never writes, as in ClickHouse
    request = urllib.request.Request(endpoint.url + "/?query=SELECT+1+FORMAT+JSON", headers={"Authorization": BASIC})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.headers["X-ClickHouse-Format"] == "JSON"
        assert response.headers["X-ClickHouse-Timezone"]
        assert json.loads(response.headers["X-ClickHouse-Summary"])["read_rows"] == "1"


def test_inserts_in_any_format(endpoint: ClickHouseHttpEndpoint) -> None:
    http(endpoint, "/", b"CREATE TABLE fmt (id Int64, s String) ENGINE = MergeTree ORDER BY id")
    assert http(endpoint, "/", b"INSERT INTO fmt FORMAT CSV\n1,a\n2,b\n")[0] == 200
    assert http(endpoint, "/?query=INSERT+INTO+fmt+FORMAT+JSONEachRow", b'{"id":3,"s":"c"}\n')[0] == 200
    assert http(endpoint, "/", b"INSERT INTO fmt SETTINGS async_insert=0 FORMAT TSV\n4\td\n")[0] == 200
    assert http(endpoint, "/", b"INSERT INTO fmt VALUES (5, 'e')")[0] == 200
    ch = client(endpoint, "zstd")
    ch.raw_insert("fmt", ["id", "s"], "6,f\n", fmt="CSV")
    ch.raw_insert("fmt", ["id", "s"], iter([b"7,g\n", b"8,h\n"]), fmt="CSV")  # streamed: query in the URL
    ordered = ch.command("SELECT groupArray(s) FROM (SELECT s FROM fmt ORDER BY id)")
    assert ordered == "['a','b','c','d','e','f','g','h']"


def test_settings_and_set_do_not_leak(endpoint: ClickHouseHttpEndpoint) -> None:
    ch = client(endpoint)
    query = "SELECT value FROM system.settings WHERE name = 'max_result_rows'"
    assert ch.command(query, settings={"max_result_rows": 7}) == 7
    assert ch.command(query) == 0
    assert http(endpoint, "/", b"SET max_result_rows = 9")[0] == 200
    assert ch.command(query) == 0
    with pytest.raises(DatabaseError, match="no_such_setting cannot be changed"):  # off the allow-list
        ch.command("SELECT 1", settings={"no_such_setting": 1})


def test_form_encoded_parameters(endpoint: ClickHouseHttpEndpoint) -> None:
    ch = client(endpoint, form_encode_query_params=True)
    # Long parameters make clickhouse-connect switch to a multipart/form-data body.
    result = ch.query("SELECT {a:String} || {b:String}", parameters={"a": "x" * 10000, "b": "y"})
    assert result.result_rows == [("x" * 10000 + "y",)]


def test_concurrent_clients(endpoint: ClickHouseHttpEndpoint) -> None:
    client(endpoint).command("CREATE TABLE conc (w Int32, i Int32) ENGINE = MergeTree ORDER BY (w, i)")
    errors: list[BaseException] = []

    def work(worker: int) -> None:
        try:
            ch = client(endpoint, compress=worker % 2 == 0)
            for i in range(5):
                ch.insert("conc", [[worker, i]], column_names=["w", "i"])
                assert ch.query("SELECT {w:Int32}", parameters={"w": worker}).result_rows == [(worker,)]
        except BaseException as ex:  # collected and re-raised in the test thread
            errors.append(ex)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert client(endpoint).command("SELECT count() FROM conc") == 80


def test_million_row_arrow_insert(endpoint: ClickHouseHttpEndpoint) -> None:
    ch = client(endpoint, "lz4")
    ch.command(
        "CREATE TABLE big (id Int64, ts DateTime64(9), host LowCardinality(String), v Float64) "
        "ENGINE = MergeTree ORDER BY id"
    )
    n = 1_000_000
    ids = np.arange(n, dtype=np.int64)
    batch = pa.table(
        {
            "id": ids,
            "ts": pa.array(ids, type=pa.timestamp("ns")),
            "host": pa.array(ids % 64).cast(pa.string()),
            "v": ids.astype(np.float64),
        }
    )
    started = time.perf_counter()
    summary = ch.insert_arrow("big", batch)
    elapsed = time.perf_counter() - started
    assert summary.written_rows == n
    assert ch.command("SELECT count(), sum(id) FROM big") == [str(n), str(n * (n - 1) // 2)]
    print(f"1M-row insert_arrow over HTTP: {elapsed:.3f} s ({n / elapsed / 1e6:.2f}M rows/s)")


def test_port_in_use(endpoint: ClickHouseHttpEndpoint) -> None:
    second = ClickHouseHttpEndpoint(endpoint.engine, port=endpoint.port, users={USER: User(PASSWORD, False)})
    with pytest.raises(PortInUse, match=f"127.0.0.1:{endpoint.port}"):
        second.start()


def test_second_process_gets_data_dir_locked(endpoint: ClickHouseHttpEndpoint, data_dir: Path) -> None:
    script = textwrap.dedent(
        f"""
        from clocktower.sinks.endpoint import ChdbEngine, DataDirLocked
        try:
            ChdbEngine({str(data_dir)!r})
        except DataDirLocked as ex:
            print("LOCKED", ex)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert done.stdout.startswith("LOCKED"), done.stderr
    assert str(data_dir) in done.stdout and "another clocktower process" in done.stdout
    with pytest.raises(DataDirLocked):
        ChdbEngine(data_dir)  # the same process may not open it twice either


def test_split_insert_follows_clickhouse_rules() -> None:
    head = b"INSERT INTO t (a, b) SETTINGS x = 'FORMAT' FORMAT CSV"
    split = split_insert(head + b"  \n1,2\n", complete=True)
    assert isinstance(split, InsertSplit)
    assert split.fmt == "CSV" and split.data_start == len(head) + 3
    expected = b"INSERT INTO t (a, b)  FROM INFILE '/f' SETTINGS x = 'FORMAT' FORMAT CSV"
    assert split.infile_sql("/f") == expected
    assert split_insert(b"INSERT INTO t FORMAT Nat", complete=False) == NEED_MORE
    values = split_insert(b"INSERT INTO t VALUES (1)", complete=False)  # VALUES data is data, never SQL
    assert isinstance(values, InsertSplit) and values.head == b"INSERT INTO t FORMAT Values" and values.data_start == 20
    assert split_insert(b"SELECT 1", complete=False) is None
