"""Settings given as JSON or as a short text form (`a,b`, `eth0=eth1`, a shell-like command line).

Environment variables are text; the same setting may also come as a list or dict from code. One place decides
when text is JSON (it starts with the JSON's own bracket) and words the error, so every such setting reads alike.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson


def json_or_text(value: Any, opener: str, what: str, parse_text: Callable[[str], Any]) -> Any:
    """`value` unchanged unless it is a string: JSON when it starts with `opener` ("[" or "{"), else
    `parse_text(stripped text)`. ValueError names `what` when the JSON is broken."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if not text.startswith(opener):
        return parse_text(text)
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as e:
        raise ValueError(f"{what} is not valid JSON: {e}") from None
