"""Bounded, deterministic ids and names built from event fields.

Node names and interfaces may each be 256 characters, so pasting them together
overflows a 256-character `Name`; a readable prefix plus a blake2b digest never
does, and the same inputs always give the same id (a replayed detector re-issues it).
"""

from __future__ import annotations

from hashlib import blake2b

NAME_LIMIT = 256
_LABEL = 64


def _digest(parts: tuple[object, ...], size: int) -> str:
    return blake2b("\x1f".join(map(str, parts)).encode("utf-8", "surrogatepass"), digest_size=size).hexdigest()


def stable_id(kind: str, *parts: object) -> str:
    """`kind:label:digest`, where label is the first part cut to 64 characters: at most 32+1+64+1+32 chars."""
    label = str(parts[0])[:_LABEL] if parts else ""
    return f"{kind[:32]}:{label}:{_digest((kind, *parts), 16)}"


def bounded_name(text: str, limit: int = NAME_LIMIT) -> str:
    """`text` if it fits in `limit`, else its head and a digest of the whole (still unique and readable)."""
    if len(text) <= limit:
        return text
    tail = "~" + _digest((text,), 8)
    return text[:limit - len(tail)] + tail
