"""Where a request's body ends: one unambiguous answer, or the request is refused (400, connection closed).

A front proxy and this server must agree on where each request ends, or a second request hidden in the first
one's body is run by whichever of them reads less (request smuggling). The endpoint once ran such a smuggled
request when both Content-Length and Transfer-Encoding were sent, took the first of two Content-Lengths, and read
`xchunked` as chunked (issue 18). So, as RFC 9112 section 6 allows a server to: Transfer-Encoding must be exactly
`chunked` and come alone, Content-Length must be one run of digits (repeats only of the same value), and the two
never come together.
"""

from __future__ import annotations

from email.message import Message


def framing_problem(headers: Message) -> str | None:
    """None when the body's framing is unambiguous; else why not, for the 400 answer."""
    encodings = headers.get_all("Transfer-Encoding") or []
    lengths = headers.get_all("Content-Length") or []
    if encodings and lengths:
        return "both Transfer-Encoding and Content-Length are present"
    if encodings:
        codings = [c.strip().lower() for value in encodings for c in value.split(",")]
        if codings != ["chunked"]:
            return f"Transfer-Encoding must be exactly 'chunked', got {', '.join(encodings)!r}"
    if lengths:
        values = {v.strip() for value in lengths for v in value.split(",")}
        if len(values) != 1:
            return "conflicting Content-Length values"
        value = values.pop()
        if not value.isascii() or not value.isdigit():
            return f"invalid Content-Length {value!r}"
    return None
