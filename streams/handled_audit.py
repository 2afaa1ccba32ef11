"""Which records reached the processors: an append-only line per record, for audits of lost input.

With CLOCKTOWER_STREAMS_AUDIT_DIR set, each stream worker appends `topic partition offset` to
`<dir>/<instance id>.log` for every record it handed to its processors, with one write(2) each, straight to the
kernel: a worker killed with SIGKILL loses none of the lines it wrote. `handled()` reads all workers' files back.
Every offset from a partition's log start to its end should be there, from some worker, at least once: a gap is
input that the streams skipped (tests/test_scale_out.py checks it). Off by default: it costs a write per record.
"""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path


class HandledAudit:
    def __init__(self, directory: Path, instance_id: str) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"{instance_id}.log"
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def record(self, topic: str, partition: int, offset: int) -> None:
        os.write(self._fd, f"{topic} {partition} {offset}\n".encode())


def handled(directory: Path) -> dict[tuple[str, int], set[int]]:
    """Per (topic, partition), the offsets some worker recorded in `directory`."""
    out: dict[tuple[str, int], set[int]] = defaultdict(set)
    for path in sorted(directory.glob("*.log")):
        for line in path.read_text().split("\n")[:-1]:   # complete lines: a live worker may be mid-write
            topic, partition, offset = line.split(" ")
            out[(topic, int(partition))].add(int(offset))
    return dict(out)
