"""Pure parts of the endpoint's guard: the session pool's insert priority, the readonly level, and the checks
on statements without a tree and on query parameters."""

from __future__ import annotations

import threading
import time

import pytest

from clocktower.sinks.endpoint import sql_guard
from clocktower.sinks.endpoint.errors import ClickHouseError
from clocktower.sinks.endpoint.protocol import readonly_level
from clocktower.sinks.endpoint.session_pool import SessionPool


def test_reserved_sessions_only_run_inserts() -> None:
    pool = SessionPool(["a", "b"], reserved=1)
    with pool.acquire(priority=False, timeout_s=1):
        with pytest.raises(ClickHouseError, match="TOO_MANY_SIMULTANEOUS_QUERIES"), pool.acquire(False, 0.05):
            pass
        with pool.acquire(priority=True, timeout_s=0.05) as insert_session:
            assert insert_session in ("a", "b")


def test_waiting_inserts_go_before_waiting_reads() -> None:
    pool = SessionPool(["only"], reserved=0)
    order: list[str] = []

    def wait(name: str, priority: bool) -> None:
        with pool.acquire(priority=priority, timeout_s=5):
            order.append(name)

    with pool.acquire(priority=False, timeout_s=1):
        read = threading.Thread(target=wait, args=("read", False))
        read.start()
        time.sleep(0.05)  # the read waits first
        insert = threading.Thread(target=wait, args=("insert", True))
        insert.start()
        time.sleep(0.05)
    read.join()
    insert.join()
    assert order == ["insert", "read"]


@pytest.mark.parametrize(
    "role_readonly, method, asked, level",
    [
        (False, "POST", None, 0),
        (False, "GET", None, 2),
        (False, "GET", "0", 2),  # a GET never writes, whatever the client asks
        (False, "POST", "2", 2),
        (False, "POST", "1", 1),
        (True, "POST", "0", 1),  # the read-only role cannot be lowered
        (True, "GET", "2", 1),
        (True, "POST", "", 1),
    ],
)
def test_readonly_level_is_the_strictest_asked(role_readonly: bool, method: str, asked: str | None,
                                               level: int) -> None:
    assert readonly_level(role_readonly, method, asked) == level


@pytest.mark.parametrize(("node_type", "formatted", "refusal"), [
    ("ShowCreateTableQuery", "SHOW CREATE TABLE t WHERE x IN (SELECT 1)", "may not hold subqueries"),
    ("ExistsTableQuery", "EXISTS TABLE loop('system', 't')", "not allowed in ExistsTable"),
    ("ShowCreateTableQuery", "SHOW CREATE TABLE merge('system', '^query')", "not allowed in ShowCreateTable"),
    ("ShowCreateTableQuery", "SHOW CREATE TABLE system.Query_Log_Raw", "query_log_raw holds"),
    ("DescribeQuery", "DESCRIBE TABLE t INTO OUTFILE 'x'", "OUTFILE"),
])
def test_treeless_statements_are_judged_on_their_text(node_type: str, formatted: str, refusal: str) -> None:
    """Statements without a tree: no subquery or table picked by an expression, no file, no raw log."""
    toks = formatted.replace("(", " ( ").split()
    calls = iter([word for word, nxt in zip(toks, toks[1:], strict=False) if nxt == "("])
    with pytest.raises(ClickHouseError, match=refusal):
        sql_guard.check_treeless(node_type, calls, 0, formatted)
    assert sql_guard.check_treeless(node_type, iter([]), 0, "SHOW CREATE TABLE t").kind == "read"


@pytest.mark.parametrize("value", ["query_log_raw", "system.QUERY_LOG_RAW", "query\\x5Flog_raw", "q\\x5Cx75ery_log_raw",
                                   "`query\\_log\\_raw`"])
def test_query_parameters_may_not_name_the_raw_log(value: str) -> None:
    with pytest.raises(ClickHouseError, match="ACCESS_DENIED|query_log_raw"):
        sql_guard.check_params({"t": value})
    sql_guard.check_params({"t": "query_log", "u": "system.one"})
