"""What a client's statement may do on the embedded engine, judged on the engine's own parse tree.

The engine parses the statement (``parseQueryToJSON``, which also refuses a
second statement) and this module walks the tree. Nothing a client sends may
reach files, the network or other processes: table functions and storage
engines are allow-listed (everything else, ``file``, ``url``, ``s3``,
``remote``, ``executable``, chdb's ``python`` ..., is refused), the scalar
``file()`` and ``disk()`` are refused, and so are naming the raw query log
(see engine_config), ``INTO OUTFILE``, ``FROM INFILE``, ``INSERT INTO FUNCTION``, dictionaries with an external source,
``BACKUP``/``RESTORE``, ``SYSTEM``, ``ATTACH ... FROM path``, and session state
(temporary tables, transactions, ``SET ROLE``). Settings, in the URL or in a
``SETTINGS`` clause anywhere in the tree, must be on settings_allowed's list;
statements the engine cannot show as a tree (DESCRIBE, SHOW CREATE ...) may
carry no ``SETTINGS`` clause, ``INTO OUTFILE`` or subquery (a DESCRIBE's table
expression is judged as a tree by the engine module). The raw query log may not be
named anywhere: in the tree, in a treeless statement's text, or in a query
parameter's value (parameters are filled in after the guard); ``loop`` and
``mergeTreeIndex``/``mergeTreeProjection`` take only string literals, so no
expression spells its name. ``SET`` and ``USE`` never
reach the shared engine: over sessionless HTTP they change nothing, as in
ClickHouse, and at readonly=1 they are refused. Pure logic: no engine here.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from clocktower.sinks.endpoint.engine_config import OWN_STATEMENTS, RAW_LOG_TABLE
from clocktower.sinks.endpoint.errors import (
    ACCESS_DENIED,
    READONLY,
    SETTING_CONSTRAINT_VIOLATION,
    ClickHouseError,
)
from clocktower.sinks.endpoint.settings_allowed import SETTINGS_ALLOWED
from clocktower.sinks.endpoint.sql_scan import tokens


def _names(text: str) -> frozenset[str]:
    """Names as the guard compares them: ASCII lower case."""
    return frozenset(text.lower().split())


# Table functions that only read the engine's own data or generate rows.
TABLE_FUNCTIONS_ALLOWED = _names(
    """
    numbers numbers_mt zeros zeros_mt generaterandom generate_series generateseries primes values
    sqlstandardvalues null view viewifpermitted viewexplain dictionary format input loop
    mergetreeindex mergetreeprojection
    """
)
# Local-only table functions nobody here needs: refused in FROM like any table function not allowed above.
# merge() picks tables by a regexp, so it could read the raw query log.
TABLE_FUNCTIONS_NOT_NEEDED = _names(
    """
    merge
    fuzzjson fuzzquery mergetreeanalyzeindexes mergetreeanalyzeindexesuuid mergetreecodecblockcounts
    mergetreetextindex timeseriesdata timeseriesmetricfamilies timeseriesmetrics timeseriessamples
    timeseriesselector timeseriestags
    """
)
# Refused in any position (scalar or table): they read or write files, reach the network or run programs.
FUNCTIONS_DENIED = _names(
    """
    file disk filecluster filesystem url urlcluster s3 s3cluster gcs oss cosn azureblobstorage
    azureblobstoragecluster hdfs hdfscluster remote remotesecure cluster clusterallreplicas executable
    executablepool mysql postgresql sqlite mongodb redis jdbc odbc bigquery ytsaurus arrowstream eval python
    iceberg icebergs3 icebergazure iceberghdfs iceberglocal icebergcluster icebergs3cluster icebergazurecluster
    iceberghdfscluster icebergLocalcluster deltalake deltalakes3 deltalakeazure deltalakelocal deltalakecluster
    deltalakes3cluster deltalakeazurecluster hudi hudicluster paimon paimons3 paimonazure paimonhdfs paimonlocal
    paimoncluster paimons3cluster paimonazurecluster paimonhdfscluster prometheusquery prometheusqueryrange
    """
)
# Table functions that name a table by their arguments: only string literals, which the raw-log check reads
# (an expression or a parameter could spell the raw log's name, and the engine resolves an identifier through
# WITH aliases: ``WITH concat('query_log', '_raw') AS t SELECT * FROM loop(system, t)``).
TABLE_NAMING_FUNCTIONS = _names("loop mergetreeindex mergetreeprojection")
# Storage and database engines that keep data inside the engine's own data directory (not Merge: it picks tables
# by a regexp, so it could read the raw query log).
ENGINES_ALLOWED = _names(
    """
    mergetree replacingmergetree summingmergetree aggregatingmergetree collapsingmergetree
    versionedcollapsingmergetree coalescingmergetree graphitemergetree memory log tinylog stripelog null buffer
    set join view materializedview livewindowview windowview dictionary generaterandom alias
    atomic ordinary lazy
    """
)
# Dictionary sources that stay inside the engine (none reach outside: ClickHouse's own connects over TCP).
DICTIONARY_SOURCES_ALLOWED = frozenset({"null"})
# Table (storage) settings are many and engine-specific, and only a few place data: refused by these words.
TABLE_SETTING_DENIED_WORDS = ("disk", "path", "policy", "zookeeper", "keeper", "file", "s3", "azure", "hdfs", "remote")
# Statement types (as the engine names its tree nodes) that a client may not run at all.
_STATEMENTS_DENIED = {
    "BackupQuery": "BACKUP and RESTORE write or read files",
    "SystemQuery": "SYSTEM statements act on the whole engine",
    "TransactionControl": "transactions need a session, and HTTP requests here have none",
}
# Statements the engine cannot show as a tree: allowed only when they only read (checked on the formatted text).
_TREELESS_READS = ("DescribeQuery", "ExistsTableQuery", "ExistsDatabaseQuery", "ExistsDictionaryQuery",
                   "ExistsViewQuery", "ShowCreate", "ShowColumns", "ShowIndexes", "ShowSettingQuery",
                   "ShowFunctions", "ShowEngines", "ShowProcesslist")
_SESSION_STATEMENTS = {"SetQuery": "SET", "UseQuery": "USE"}
_READS = frozenset({"SelectWithUnionQuery", "SelectIntersectExceptQuery", "ExplainQuery", "ShowTablesQuery"})


@dataclass(frozen=True)
class Verdict:
    """How to run an allowed statement: ``kind`` is insert, read or write; ``session`` is SET/USE (a no-op)."""

    kind: str
    session: str | None = None


def _denied(message: str) -> ClickHouseError:
    return ClickHouseError(ACCESS_DENIED, message, "ACCESS_DENIED")


def _fold(name: str) -> str:
    """ASCII case folding, as the engine's case-insensitive names use (never Unicode tricks)."""
    return name.lower() if name.isascii() else name


def check_setting(name: str, value: object, cap_s: float, ceilings: Mapping[str, int] | None = None) -> None:
    """Refuse a setting off the allow-list, a ``max_execution_time`` above the cap (or unlimited), and a
    setting in ``ceilings`` (max_threads, max_memory_usage: the sessions' baseline) above its ceiling or 0.

    ``readonly`` may only be raised: the engine refuses it where readonly is already set.
    """
    if _fold(name) == "readonly" and str(value).strip().strip("'") not in ("", "0"):
        return
    if _fold(name) not in SETTINGS_ALLOWED:
        raise _denied(f"Setting {name} cannot be changed on the embedded endpoint (not on its allow-list)")
    ceiling = (ceilings or {}).get(_fold(name), 0)
    if ceiling:
        _check_ceiling(name, value, ceiling)
    if _fold(name) == "max_execution_time":
        try:
            seconds = float(str(value).strip().strip("'"))
        except ValueError:
            return  # the engine reports the bad value itself
        if seconds <= 0 or seconds > cap_s:
            raise ClickHouseError(
                SETTING_CONSTRAINT_VIOLATION,
                f"Setting max_execution_time shouldn't be 0 or greater than {cap_s:g}",
                "SETTING_CONSTRAINT_VIOLATION",
            )


def _check_ceiling(name: str, value: object, ceiling: int) -> None:
    try:
        number = float(str(value).strip().strip("'"))
    except ValueError:  # 'auto' (every core), '10G', ...: refused rather than judged
        number = 0
    if number <= 0 or number > ceiling:
        raise ClickHouseError(
            SETTING_CONSTRAINT_VIOLATION,
            f"Setting {name} shouldn't be 0 or greater than {ceiling} on the embedded endpoint",
            "SETTING_CONSTRAINT_VIOLATION",
        )


def check_settings(settings: Mapping[str, str], cap_s: float, ceilings: Mapping[str, int] | None = None) -> None:
    for name, value in settings.items():
        check_setting(name, value, cap_s, ceilings)


_ESCAPED_BYTE_RE = re.compile(r"\\x([0-9A-Fa-f]{2})")
_OWN_TEXTS = frozenset(sql.encode() for sql in OWN_STATEMENTS)


def check_own_statement(statement: bytes) -> None:
    """Refuse a client statement written as one of the endpoint's own: the query_log view leaves those out."""
    if statement.strip().rstrip(b";").strip() in _OWN_TEXTS:
        raise _denied("This statement is the endpoint's own and is not allowed from clients")


def check_params(params: Mapping[str, str] | None) -> None:
    """Refuse query parameters that name the raw query log.

    The guard judges the statement before the engine fills its parameters in, so ``system.{t:Identifier}``
    with t=query_log_raw would pass it. Values come in ClickHouse's escaped format (``\\x5F`` is ``_``):
    judged as sent and unescaped, ASCII case folded.
    """
    for value in (params or {}).values():
        text = unescaped = str(value)
        while True:  # an escape may spell another (``\\x5Cx5F``: a quoted identifier's escapes are read again)
            decoded = _ESCAPED_BYTE_RE.sub(lambda m: chr(int(m.group(1), 16)), unescaped)
            if decoded == unescaped:
                break
            unescaped = decoded
        if any(RAW_LOG_TABLE in form.lower() for form in (text, unescaped.replace("\\", ""))):
            raise _denied(f"system.{RAW_LOG_TABLE} holds the endpoint's own statements: read system.query_log")


def check_tree(
    tree: Mapping[str, Any],
    readonly: int,
    cap_for: Callable[[str], float],
    ceilings: Mapping[str, int] | None = None,
) -> Verdict:
    """Judge one parsed statement; raises ClickHouseError when it is refused.

    ``cap_for`` gives the max_execution_time cap of a statement kind (read, write, insert); ``ceilings``
    the most a client may set some settings to (see check_setting).
    """
    kind = str(tree.get("type", ""))
    if kind in _SESSION_STATEMENTS and (kind != "SetQuery" or tree.get("is_standalone")):
        return session_statement(_SESSION_STATEMENTS[kind], readonly)
    if kind in _STATEMENTS_DENIED:
        raise _denied(f"{_STATEMENTS_DENIED[kind]}: not allowed on the embedded endpoint")
    if kind == "KillQueryQuery" and readonly:
        # Every session is the engine's one user, so a reader could otherwise kill the sink's inserts.
        raise ClickHouseError(READONLY, "Cannot execute KILL in readonly mode", "READONLY")
    if kind == "InsertQuery" and "table_function" in tree:
        raise _denied("INSERT INTO FUNCTION is not allowed on the embedded endpoint")
    if kind == "CreateQuery":
        _check_create(tree)
    if _mentions(tree, RAW_LOG_TABLE):
        raise _denied(f"system.{RAW_LOG_TABLE} holds the endpoint's own statements: read system.query_log")
    verdict = Verdict("insert" if kind == "InsertQuery" else "read" if kind in _READS else "write")
    cap_s = cap_for(verdict.kind)
    for key, node, parent in _walk(tree, ""):
        _check_node(key, node, cap_s, ceilings, table_level=parent == "Storage" or key == "settings_changes")
    return verdict


def check_treeless(node_type: str, keyword_calls: Iterator[str], readonly: int, formatted: str = "") -> Verdict:
    """Judge a statement the engine cannot show as a tree, from its type and its text as the engine formats it.

    ``keyword_calls`` are the words followed by ``(`` in ``formatted``. Its settings cannot be judged without a
    tree (``DESCRIBE (SELECT ...) SETTINGS max_execution_time = 0`` lifted the time cap), so SETTINGS is refused;
    so are INTO OUTFILE (``DESCRIBE t INTO OUTFILE`` wrote a file), naming the raw log, and, but in a DESCRIBE
    (whose table expression the engine judges as a tree first), subqueries and table functions that pick
    tables by an expression.
    """
    if node_type == "SetRoleQuery":
        return session_statement("SET ROLE", readonly)
    statement = node_type.removesuffix("Query")
    if not node_type.startswith(_TREELESS_READS):
        raise _denied(f"{statement} statements are not allowed on the embedded endpoint")
    words = {token.text for token in tokens(formatted.encode())}
    if "SETTINGS" in words:
        raise _denied(f"{statement} statements may not carry SETTINGS on the embedded endpoint")
    if words & {"OUTFILE", "INFILE"}:
        raise _denied("INTO OUTFILE and FROM INFILE are not allowed on the embedded endpoint")
    if RAW_LOG_TABLE in formatted.lower():
        raise _denied(f"system.{RAW_LOG_TABLE} holds the endpoint's own statements: read system.query_log")
    for name in keyword_calls:
        if _fold(name) in FUNCTIONS_DENIED:
            raise _denied(f"Function {name} is not allowed on the embedded endpoint")
        if node_type != "DescribeQuery" and _fold(name) in TABLE_NAMING_FUNCTIONS | TABLE_FUNCTIONS_NOT_NEEDED:
            raise _denied(f"Function {name} is not allowed in {statement} statements on the embedded endpoint")
    if "SELECT" in words and node_type != "DescribeQuery":
        raise _denied(f"{statement} statements may not hold subqueries on the embedded endpoint")
    return Verdict("read")


def session_statement(statement: str, readonly: int) -> Verdict:
    """SET / USE / SET ROLE: refused at readonly=1, else a no-op (HTTP requests here carry no session)."""
    if readonly == 1:
        raise ClickHouseError(READONLY, f"Cannot execute {statement} in readonly mode", "READONLY")
    if statement == "SET ROLE":
        raise _denied("SET ROLE is not supported by the embedded endpoint")
    return Verdict("session", statement)


def _check_create(tree: Mapping[str, Any]) -> None:
    if tree.get("is_temporary"):
        raise _denied("Temporary tables need a session, and HTTP requests here have none")
    if tree.get("has_attach_from_path") or "attach_from_path" in tree:
        raise _denied("ATTACH ... FROM a path is not allowed on the embedded endpoint")
    if tree.get("is_dictionary"):
        source = (tree.get("dictionary") or {}).get("source") or {}
        name = _fold(str(source.get("name", "")))
        if name not in DICTIONARY_SOURCES_ALLOWED:
            raise _denied(f"Dictionary source {name or '?'} is not allowed on the embedded endpoint")


def check_table_setting(name: str) -> None:
    """Refuse a table (storage) setting that could place data elsewhere: disks, policies, paths, remote storage."""
    folded = _fold(name)
    if not folded.isascii() or any(word in folded for word in TABLE_SETTING_DENIED_WORDS):
        raise _denied(f"Table setting {name} is not allowed on the embedded endpoint")


def _check_node(
    key: str, node: Mapping[str, Any], cap_s: float, ceilings: Mapping[str, int] | None, table_level: bool = False
) -> None:
    node_type = node.get("type")
    if key in ("out_file", "infile"):
        raise _denied("INTO OUTFILE and FROM INFILE are not allowed on the embedded endpoint")
    if node_type == "SetQuery":
        for change in node.get("changes") or ():
            field = change.get("value") if isinstance(change.get("value"), dict) else {}
            if field.get("field_type") == "CustomType":  # an expression as a value, e.g. disk = disk(path = ...)
                raise _denied(f"Setting {change.get('name')} = <expression> is not allowed on the embedded endpoint")
            value = field.get("value")
            if table_level:
                check_table_setting(str(change.get("name", "")))
            else:
                check_setting(str(change.get("name", "")), value if value is not None else "", cap_s, ceilings)
        return
    if node_type not in ("Function", "FunctionWithKeyValueArguments"):
        return
    name = str(node.get("name", ""))
    folded = _fold(name)
    if folded in FUNCTIONS_DENIED:
        raise _denied(f"Function {name} is not allowed on the embedded endpoint")
    if node_type == "FunctionWithKeyValueArguments":
        if key == "source" and folded not in DICTIONARY_SOURCES_ALLOWED:
            raise _denied(f"Dictionary source {name} is not allowed on the embedded endpoint")
        return
    engine_kind = str(node.get("kind", ""))
    if key == "engine" or engine_kind.endswith("_ENGINE"):
        if folded not in ENGINES_ALLOWED:
            raise _denied(f"Engine {name} is not allowed on the embedded endpoint")
    elif engine_kind == "BACKUP_NAME":
        raise _denied("BACKUP and RESTORE are not allowed on the embedded endpoint")
    elif key in ("table_function", "as_table_function") and folded not in TABLE_FUNCTIONS_ALLOWED:
        raise _denied(f"Table function {name} is not allowed on the embedded endpoint")
    if folded in TABLE_NAMING_FUNCTIONS:
        arguments = (node.get("arguments") or {}).get("children") or ()
        if not all(arg.get("type") == "Literal" and (arg.get("value") or {}).get("field_type") == "String"
                   for arg in arguments):
            raise _denied(f"Table function {name} takes only string literals on the embedded endpoint")


def _mentions(node: Any, name: str) -> bool:
    """True when any string in the tree (a table's name, a literal) contains ``name``, ASCII case folded."""
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if name in _fold(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def _walk(node: Any, key: str) -> Iterator[tuple[str, Mapping[str, Any], str]]:
    """Every dict in the tree with the key it hangs under and its parent's type (list items inherit both)."""
    stack: list[tuple[str, Any, str]] = [(key, node, "")]
    while stack:
        key, node, parent = stack.pop()
        if isinstance(node, dict):
            yield key, node, parent
            own = str(node.get("type", ""))
            stack.extend((k, v, own) for k, v in node.items() if isinstance(v, dict | list))
        elif isinstance(node, list):
            stack.extend((key, v, parent) for v in node)
