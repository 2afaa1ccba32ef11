"""`clocktower query` prints what the server stored, in full: through the real embedded endpoint (broker and
endpoint only, no sink), with the CLI run in this process so each call is quick."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from clocktower import cli
from tests.conftest import Pipeline, start_services

BIG = 18446744073709551615  # UInt64 max: a float or a cut column would change it
TS = "2026-01-02 03:04:05.123456789"  # DateTime64(9): Python's datetime would drop the last three digits
DDL = ("CREATE TABLE {name} (id UInt8, t DateTime64(9, 'UTC'), m Map(String, UInt8), a Array(UInt8), "
       "tu Tuple(UInt8, String), big UInt64, s String) ENGINE = MergeTree ORDER BY id")
ROW = f"(1, '{TS}', {{'a': 1, 'b': 2}}, [1, 2, 3], (7, 'x'), {BIG}, 'a value long enough to be cut short')"


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    p = start_services(tmp_path_factory.mktemp("query") / "ct")
    try:
        yield p
    finally:
        p.stack.stop()


def query(services: Pipeline, capsys: pytest.CaptureFixture[str], *args: str) -> str:
    s = services.settings
    code = cli.main(["query", *args, "--data-dir", str(s.data_dir), "--kafka-port", str(s.kafka_port),
                     "--http-port", str(s.http_port)])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


@pytest.fixture(scope="module", autouse=True)
def typed(services: Pipeline) -> None:
    services.client.command(DDL.format(name="typed"))
    services.client.command(f"INSERT INTO typed VALUES {ROW}")


def test_ddl_and_insert_print_nothing(services: Pipeline, capsys: pytest.CaptureFixture[str]) -> None:
    assert query(services, capsys, DDL.format(name="ddl_check")) == ""
    assert query(services, capsys, f"INSERT INTO ddl_check VALUES {ROW}") == ""
    assert query(services, capsys, "DROP TABLE ddl_check") == ""


def test_json_keeps_every_value_exact(services: Pipeline, capsys: pytest.CaptureFixture[str]) -> None:
    out = query(services, capsys, "SELECT * FROM typed", "--format", "json")
    assert json.loads(out) == [{"id": 1, "t": TS, "m": {"a": 1, "b": 2}, "a": [1, 2, 3], "tu": [7, "x"],
                                "big": BIG, "s": "a value long enough to be cut short"}]


def test_table_shows_whole_values_on_a_narrow_terminal(services: Pipeline, capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "40")
    out = query(services, capsys, "SELECT * FROM typed")
    for whole in (TS, str(BIG), "a value long enough to be cut short", "{'a':1,'b':2}", "(7,'x')"):
        assert whole in out, f"{whole!r} not shown whole in\n{out}"


def test_a_format_clause_gets_the_servers_output_unchanged(services: Pipeline,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    out = query(services, capsys, "SELECT id, t, big FROM typed FORMAT JSONEachRow", "--format", "csv")
    assert out == f'{{"id":1,"t":"{TS}","big":{BIG}}}\n'
    assert query(services, capsys, "SELECT id, big FROM typed FORMAT TSV;") == f"1\t{BIG}\n"


def test_sql_from_stdin(services: Pipeline, capsys: pytest.CaptureFixture[str],
                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("SELECT big\nFROM typed\n"))
    assert query(services, capsys, "-", "--format", "csv") == f'"big"\n{BIG}\n'


def test_empty_result_and_empty_sql(services: Pipeline, capsys: pytest.CaptureFixture[str],
                                    tmp_path: Path) -> None:
    assert json.loads(query(services, capsys, "SELECT * FROM typed WHERE id = 0", "--format", "json")) == []
    s = services.settings
    assert cli.main(["query", "  ", "--data-dir", str(s.data_dir), "--http-port", str(s.http_port)]) == 2
    assert "no SQL" in capsys.readouterr().err
