"""A ClickHouse string literal, for the few statements that cannot take a query parameter (DDL, ALTER)."""


def quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
