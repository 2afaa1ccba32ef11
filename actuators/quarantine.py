"""Links an operator must release before they carry traffic again, on disk (they stay quarantined over restarts).

A quarantined link stays on its backup: the actuator refuses `restore` for it until a `release` (sent by
`clocktower control release NODE IFACE`). The backup is kept with the mark, so a release that names none still
knows where the traffic is. Same durability as the seen-command memory (journal.py): a line per change, fsynced;
compacted to the quarantined links on open.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from clocktower.actuators.journal import Journal

FILE_NAME = "quarantine.jsonl"


@dataclass(frozen=True)
class QuarantineMark:
    link: str
    backup: str
    since_ns: int
    command_id: str


class Quarantine:
    """Thread-safe set of quarantined links, in `state_dir`/quarantine.jsonl."""

    def __init__(self, state_dir: Path, clock: Callable[[], int] = time.time_ns) -> None:
        self.clock = clock
        self._journal = Journal(state_dir / FILE_NAME)
        self._lock = threading.Lock()
        self._marks: dict[str, QuarantineMark] = {}
        for e in self._journal.load():
            try:
                link = str(e["link"])
                if e.get("quarantined"):
                    self._marks[link] = QuarantineMark(link, str(e["backup"]), int(e["since_ns"]),
                                                       str(e.get("command_id", "")))
                else:
                    self._marks.pop(link, None)
            except (KeyError, TypeError, ValueError):
                pass
        self._journal.rewrite(self._entry(m, True) for m in self._marks.values())

    @staticmethod
    def _entry(m: QuarantineMark, quarantined: bool) -> dict[str, object]:
        return {"link": m.link, "backup": m.backup, "since_ns": m.since_ns, "command_id": m.command_id,
                "quarantined": quarantined}

    def get(self, link: str) -> QuarantineMark | None:
        # Without the lock: mark/unmark hold it across an fsynced append, and the agent's link source asks for
        # every report it builds (before its watchdog sees the report). A dict read is atomic; marks are replaced.
        return self._marks.get(link)

    def links(self) -> list[str]:
        with self._lock:
            return sorted(self._marks)

    def mark(self, link: str, backup: str, command_id: str = "") -> QuarantineMark:
        """Quarantine `link` (idempotent: an existing mark is kept as it was)."""
        with self._lock:
            if (m := self._marks.get(link)) is not None:
                return m
            m = QuarantineMark(link, backup, self.clock(), command_id)
            self._journal.append(self._entry(m, True))
            self._marks[link] = m
            return m

    def unmark(self, link: str) -> QuarantineMark | None:
        """Release `link`; returns the mark it had (None: it was not quarantined)."""
        with self._lock:
            m = self._marks.get(link)
            if m is None:
                return None
            self._journal.append(self._entry(m, False))
            del self._marks[link]
            return m

    def close(self) -> None:
        with self._lock:
            self._journal.close()
