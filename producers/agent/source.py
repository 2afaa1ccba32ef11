"""What every node-agent source is: a check of whether this machine can run it, and start/stop.

A source emits lists of events through the `Emit` callback it is started with (thread-safe, never
blocks for long: the runner's sink batches and spools). Each source runs its own thread(s) or loop, so
a slow one never holds up another. `check()` is cheap and side-effect free; the runner calls it first
and reports the reason for every source left off.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from clocktower.schemas.event import Event

Emit = Callable[[list[Event]], None]


@dataclass(frozen=True)
class Availability:
    """Whether a source can run here, and why (or why not), in words a user can act on."""

    ok: bool
    reason: str


class Source(Protocol):
    name: str                    # "gpu", "flows", "links", ...
    counts: Counter[str]         # events emitted so far, per schema

    def check(self) -> Availability: ...

    def start(self, emit: Emit) -> None: ...

    def stop(self) -> None: ...
