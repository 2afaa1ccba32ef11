"""Forget the stream processors' state: the demo's simulated fleet is a new one on every run.

The state of a real fleet is kept across restarts on purpose (tables with changelogs). The demo reuses its
data dir but simulates a fresh fleet under the same node names, so the last run's state (a GPU already
marked lost, a port's carrier count) would change what this run detects. Deleting the changelog topics and
the workers' local stores before the workers start makes each demo run start from nothing.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from confluent_kafka.admin import AdminClient

from clocktower.streams.registry import PROCESSORS, changelog_topic


def reset_stream_state(bootstrap: str, data_dir: Path, timeout: float = 15.0) -> list[str]:
    """Delete the changelog topics that exist and the workers' local stores; returns the topics deleted."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 4})
    existing = set(admin.list_topics(timeout=timeout).topics)
    doomed = [changelog_topic(c) for c in PROCESSORS if c.durable and changelog_topic(c) in existing]
    for fut in (admin.delete_topics(doomed, request_timeout=timeout).values() if doomed else ()):
        fut.result(timeout)
    shutil.rmtree(data_dir / "streams", ignore_errors=True)
    return doomed
