"""Recent sql_guard verdicts, so a statement sent again is not parsed by the engine again.

Dashboards repeat the same statements (Grafana refreshes every panel), and judging one costs an engine
round trip. A verdict depends only on the statement's text and the readonly level (the parser's settings
are the sessions' fixed baseline), so an exact repeat gets the same verdict. Only allowed statements
are kept (a refusal is always judged afresh), short ones only, and the oldest go first.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from clocktower.sinks.endpoint.sql_guard import Verdict

MAX_ENTRIES = 1024
MAX_STATEMENT_BYTES = 16 << 10


class VerdictCache:
    """A bounded, thread-safe map of (readonly, statement) to the guard's verdict."""

    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        self._entries: OrderedDict[tuple[int, bytes], Verdict] = OrderedDict()
        self._max = max_entries
        self._lock = threading.Lock()

    def get(self, statement: bytes, readonly: int) -> Verdict | None:
        with self._lock:
            verdict = self._entries.get((readonly, statement))
            if verdict is not None:
                self._entries.move_to_end((readonly, statement))
            return verdict

    def put(self, statement: bytes, readonly: int, verdict: Verdict) -> None:
        if len(statement) > MAX_STATEMENT_BYTES:
            return
        with self._lock:
            self._entries[(readonly, statement)] = verdict
            self._entries.move_to_end((readonly, statement))
            while len(self._entries) > self._max:
                self._entries.popitem(last=False)
