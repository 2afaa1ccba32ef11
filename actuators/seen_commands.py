"""The ids of the commands an actuator has handled, on disk, so a replayed command is refused even after a restart.

Only verified commands are recorded (a forged one could otherwise claim a genuine command's id first). Each is
recorded twice: "started" before it is applied, and its outcome (applied/failed) after. An id whose outcome is
recorded is a replay; an id only started was interrupted by a crash mid-apply, and is applied again (every action
is idempotent). An entry is kept until its command's expiry plus `margin_ns`: after that the command is refused as
expired anyway, whatever this memory says (the margin covers a clock stepped back). Expired entries are dropped
when the file is opened (compaction, which also repairs a line torn by a crash) and, in a long-running actuator,
whenever the lines appended since the last compaction outnumber `COMPACT_AFTER_LINES` and twice the ids it kept, so
neither the file nor the memory grows without bound.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from clocktower.actuators.journal import Journal

FILE_NAME = "seen-commands.jsonl"
DEFAULT_MARGIN_NS = 600 * 10**9   # kept 10 min past expiry: a clock stepped back by less still refuses the replay
STARTED = "started"
COMPACT_AFTER_LINES = 1000        # appends (two per command) before expired entries are dropped while running


@dataclass(frozen=True)
class Seen:
    """What the memory holds about one command id."""

    first_ns: int        # when it was first handled (the actuator's clock)
    expires_ns: int
    status: str          # "started" (not finished: a crash mid-apply), "applied" or "failed"

    @property
    def finished(self) -> bool:
        return self.status != STARTED


class SeenCommands:
    """Thread-safe memory of handled command ids, in `state_dir`/seen-commands.jsonl."""

    def __init__(self, state_dir: Path, clock: Callable[[], int] = time.time_ns,
                 margin_ns: int = DEFAULT_MARGIN_NS) -> None:
        self.clock = clock
        self.margin_ns = margin_ns
        self._journal = Journal(state_dir / FILE_NAME)
        self._lock = threading.Lock()
        self._seen: dict[str, Seen] = {}
        self._appended = 0                 # lines appended since the last compaction
        self._kept = 0                     # ids the last compaction kept
        self.compactions = 0
        for e in self._journal.load():
            try:
                cid, status = str(e["id"]), str(e["status"])
                prev = self._seen.get(cid)
                first = prev.first_ns if prev else int(e["first_ns"])
                self._seen[cid] = Seen(first, int(e["expires_ns"]), status)
            except (KeyError, TypeError, ValueError):
                self._journal.skipped += 1
        self.torn_lines = self._journal.skipped
        self._compact()

    def _compact(self) -> None:
        keep_after = self.clock() - self.margin_ns
        self._seen = {cid: s for cid, s in self._seen.items() if s.expires_ns > keep_after}
        self._journal.rewrite(self._entry(cid, s) for cid, s in self._seen.items())
        self._appended, self._kept = 0, len(self._seen)
        self.compactions += 1

    @staticmethod
    def _entry(cid: str, s: Seen) -> dict[str, object]:
        return {"id": cid, "first_ns": s.first_ns, "expires_ns": s.expires_ns, "status": s.status}

    def __len__(self) -> int:
        with self._lock:
            return len(self._seen)

    def get(self, command_id: str) -> Seen | None:
        with self._lock:
            return self._seen.get(command_id)

    def claim(self, command_id: str, expires_ns: int) -> Seen | None:
        """Record `command_id` as started, durably, unless it was handled before: then return that (a replay).

        An id recorded as started but not finished is claimed again (returns None): it was interrupted mid-apply.
        """
        with self._lock:
            prev = self._seen.get(command_id)
            if prev is not None and prev.finished:
                return prev
            seen = Seen(prev.first_ns if prev else self.clock(), expires_ns, STARTED)
            self._journal.append(self._entry(command_id, seen))
            self._seen[command_id] = seen
            return None

    def finish(self, command_id: str, status: str) -> None:
        """Record the outcome of a claimed command, durably."""
        with self._lock:
            prev = self._seen[command_id]
            seen = Seen(prev.first_ns, prev.expires_ns, status)
            self._journal.append(self._entry(command_id, seen))
            self._seen[command_id] = seen
            self._appended += 2                              # its "started" line and this one
            if self._appended > max(COMPACT_AFTER_LINES, 2 * self._kept):
                self._compact()

    def close(self) -> None:
        with self._lock:
            self._journal.close()
