"""Just enough of ClickHouse's lexer to route an HTTP request without parsing SQL.

The endpoint must know where INSERT data starts (so it can go to a file for
``FROM INFILE``), which output format a query asks for, and whether a request
holds more than one statement. All of that depends on top-level keywords only,
so a tokenizer that skips strings, quoted names, comments and parentheses is
enough; the engine parses the real statement.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

_TOKEN_RE = re.compile(
    rb"""
      (?P<space>\s+)
    | (?P<comment>--[^\n]*|\#[ !][^\n]*)
    | (?P<nested>/\*)
    | (?P<string>'(?:[^'\\]|\\.|'')*(?:'|\Z))
    | (?P<quoted>"(?:[^"\\]|\\.|"")*(?:"|\Z)|`(?:[^`\\]|\\.|``)*(?:`|\Z))
    | (?P<dollar>\$)
    | (?P<word>[A-Za-z_][A-Za-z0-9_$]*)
    | (?P<number>[0-9][A-Za-z0-9_.]*)
    | (?P<other>.)
    """,
    re.VERBOSE | re.DOTALL,
)
_COMMENT_EDGE_RE = re.compile(rb"/\*|\*/")

# Statements that return a result set (ClickHouse then reports X-ClickHouse-Format)
# and that are safe where ClickHouse forces readonly (HTTP GET, readonly=1).
READ_ONLY_KEYWORDS = frozenset({"SELECT", "WITH", "SHOW", "DESCRIBE", "DESC", "EXPLAIN", "EXISTS", "("})
_INSERT_QUERY_KEYWORDS = frozenset({"SELECT", "WITH", "INFILE"})


@dataclass(frozen=True)
class Token:
    """A token and its parenthesis depth: words upper-cased, strings and quoted names as ""."""

    text: str
    start: int
    end: int
    depth: int


def tokens(sql: bytes) -> Iterator[Token]:
    """Yield significant tokens with their parenthesis depth (comments and spaces dropped).

    Unterminated strings, quoted names, heredocs and comments run to the end of
    the text, as the engine's lexer would read them (and then reject them).
    """
    depth = 0
    pos, end = 0, len(sql)
    while pos < end:
        match = _TOKEN_RE.match(sql, pos)
        assert match is not None  # ``other`` matches any byte
        kind = match.lastgroup
        start, pos = match.start(), match.end()
        if kind == "nested":
            pos = _comment_end(sql, pos)
            if pos < 0:  # never closed: the engine's lexer reports an error token, not a comment
                yield Token("/*", start, end, depth)
                return
            continue
        if kind == "dollar":
            heredoc_end = _heredoc_end(sql, start)
            if heredoc_end is not None:
                pos = heredoc_end
                yield Token("", start, pos, depth)
                continue
        if kind in ("space", "comment"):
            continue
        raw = match.group()
        if kind == "word":
            yield Token(raw.decode().upper(), start, pos, depth)
            continue
        if raw == b")":
            depth = max(depth - 1, 0)
        text = raw.decode("latin-1") if kind in ("other", "number") else ""
        yield Token(text, start, pos, depth)
        if raw == b"(":
            depth += 1


def _heredoc_end(sql: bytes, start: int) -> int | None:
    """End of the heredoc at ``start``, as ClickHouse's lexer reads one: ``$tag$ ... $tag$``.

    The tag is whatever lies between the first two ``$`` (``$$`` has an empty tag); without a
    closing copy of it, the ``$`` is not a heredoc.
    """
    tag_end = sql.find(b"$", start + 1)
    if tag_end < 0:
        return None
    tag = sql[start : tag_end + 1]
    closing = sql.find(tag, tag_end + 1)
    return None if closing < 0 else closing + len(tag)


def _comment_end(sql: bytes, pos: int) -> int:
    """Where a ``/* ... */`` comment that opened before ``pos`` ends (-1: never); ClickHouse nests them."""
    level = 1
    for edge in _COMMENT_EDGE_RE.finditer(sql, pos):
        level += 1 if edge.group() == b"/*" else -1
        if level == 0:
            return edge.end()
    return -1


@dataclass(frozen=True)
class Statement:
    """What the endpoint needs to know about a complete, non-INSERT-data statement."""

    keyword: str
    output_format: str | None
    multi_statement: bool
    format_span: tuple[int, int] | None = None
    from_infile: bool = False

    @property
    def returns_rows(self) -> bool:
        return self.keyword in READ_ONLY_KEYWORDS

    def without_format(self, sql: bytes) -> bytes:
        """The statement minus its FORMAT clause and trailing ';', e.g. to wrap it in DESCRIBE."""
        if self.format_span is not None:
            sql = sql[: self.format_span[0]] + sql[self.format_span[1] :]
        return sql.rstrip().rstrip(b";")


def describe(sql: bytes) -> Statement:
    """Find the leading keyword, a trailing ``FORMAT name`` and any second statement.

    INSERTs with data never get here (see :func:`split_insert`), so everything
    after the first top-level ``;`` that is not another ``;`` is a second statement.
    """
    toks = [t for t in tokens(sql) if t.depth == 0]
    keyword = toks[0].text if toks else ""
    infile = keyword == "INSERT" and any(t.text == "INFILE" for t in toks)
    multi = False
    for i, tok in enumerate(toks):
        if tok.text == ";" and any(t.text != ";" for t in toks[i + 1 :]):
            multi = True
            break
    span = _format_span(toks)
    fmt = sql[span[0] : span[1]].split()[-1].decode() if span else None
    return Statement(keyword, fmt, multi, span, infile)


def _format_span(toks: list[Token]) -> tuple[int, int] | None:
    """Where ``FORMAT name`` is: the last FORMAT that only SETTINGS or ';' may follow."""
    for i in range(len(toks) - 2, -1, -1):
        if toks[i].text != "FORMAT" or not toks[i + 1].text.isidentifier():
            continue
        rest = toks[i + 2 :]
        if not rest or rest[0].text in ("SETTINGS", ";"):
            return toks[i].start, toks[i + 1].end
    return None


@dataclass(frozen=True)
class InsertSplit:
    """An ``INSERT ... FORMAT fmt`` head and where its data begins.

    ``infile_at`` is where ``FROM INFILE '...'`` must go: before a SETTINGS
    clause if there is one, else before FORMAT.
    """

    head: bytes
    infile_at: int
    data_start: int
    fmt: str

    def infile_sql(self, path: str) -> bytes:
        quoted = "'" + path.replace("\\", "\\\\").replace("'", "\\'") + "'"
        return self.head[: self.infile_at] + f" FROM INFILE {quoted} ".encode() + self.head[self.infile_at :]


NEED_MORE = "need-more"


def split_insert(buf: bytes, complete: bool) -> InsertSplit | str | None:
    """Split ``INSERT ... FORMAT fmt<data>`` or ``INSERT ... VALUES <data>`` the way ClickHouse does.

    Returns the split, ``None`` when ``buf`` is not an insert with attached
    data (so it is a plain statement), or ``NEED_MORE`` when ``buf`` is an
    incomplete prefix that cannot be decided yet. ``VALUES`` data becomes
    ``FORMAT Values`` data, so it is parsed as data and never as SQL: the
    engine would otherwise run whatever follows a ``;`` after the values.
    """
    settings_at: int | None = None
    before_last: Token | None = None
    last: Token | None = None
    toks = tokens(buf)
    first = next(toks, None)
    if first is None:
        return None if complete else NEED_MORE
    if first.text != "INSERT":
        return None
    for tok in toks:
        if tok.depth:
            continue
        if tok.text == "VALUES":
            if tok.end == len(buf) and not complete:
                return NEED_MORE
            before = buf[: tok.start].rstrip(b" \t")  # keep newlines: one may end a -- comment
            head = before + b" FORMAT Values"
            return InsertSplit(head, len(before) if settings_at is None else settings_at, tok.end, "Values")
        if tok.text in _INSERT_QUERY_KEYWORDS:
            return None
        # The SETTINGS clause is SETTINGS name = ...; a table named `settings` is not one.
        if (tok.text == "=" and settings_at is None and before_last is not None and last is not None
                and before_last.text == "SETTINGS" and last.text.isidentifier()):
            settings_at = before_last.start
        before_last, last = last, tok
        if tok.text == "FORMAT":
            name = next(toks, None)
            if name is None or (name.end == len(buf) and not complete):
                return NEED_MORE
            if not name.text.isidentifier():
                return None
            data_start = _data_start(buf, name.end, complete)
            if data_start is None:
                return NEED_MORE
            fmt = buf[name.start : name.end].decode()
            head = buf[: name.end]
            return InsertSplit(head, tok.start if settings_at is None else settings_at, data_start, fmt)
    return None if complete else NEED_MORE


def _data_start(buf: bytes, pos: int, complete: bool) -> int | None:
    """Data starts after blanks and one optional newline that follow the format name."""
    end = len(buf)
    while pos < end and buf[pos] in b" \t\f":
        pos += 1
    if pos < end and buf[pos] == ord("\r"):
        pos += 1
    if pos == end and not complete:
        return None
    if pos < end and buf[pos] == ord("\n"):
        pos += 1
    return pos
