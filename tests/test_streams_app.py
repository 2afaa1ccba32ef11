"""The stream worker's factory: importing it does nothing; `build_app(settings)` wires one agent per topic the
streams read and one table per durable processor, and refuses to start without a control key before any network.

Each case runs in a subprocess: `build_app` patches aiokafka and Faust for the whole process."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from clocktower.generated_secrets import ensure_control_keys
from clocktower.streams.registry import PROCESSORS, changelog_topic, streams_reads

UNPATCHED = """
import aiokafka.consumer.consumer as c
from aiokafka.consumer.group_coordinator import GroupCoordinator
from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread
print(json.dumps({"fetcher": c.Fetcher.__name__,
                  "faust_fixed": AIOKafkaConsumerThread.seek_to_committed.__module__.startswith("clocktower"),
                  "join_guarded": GroupCoordinator._coordination_routine.__module__.startswith("clocktower")}))
"""


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A port that accepts but never answers: whoever connects to it is seen (accept), and learns nothing."""
    with socket.create_server(("127.0.0.1", 0)) as s:
        s.setblocking(False)
        yield s


def _connections(s: socket.socket) -> int:
    n = 0
    while True:
        try:
            conn, _ = s.accept()
        except BlockingIOError:
            return n
        conn.close()
        n += 1


def _run(code: str, data_dir: Path, bootstrap: str) -> subprocess.CompletedProcess[str]:
    data_dir.chmod(0o700)
    env = {**os.environ, "CLOCKTOWER_DATA_DIR": str(data_dir), "CLOCKTOWER_KAFKA_BOOTSTRAP": bootstrap,
           "CLOCKTOWER_CONTROL_PRIVATE_KEY_FILE": str(data_dir / "control.key")}
    return subprocess.run([sys.executable, "-c", "import json\n" + code], env=env, capture_output=True, text=True,
                          timeout=120)


def test_importing_the_worker_reads_no_key_queries_no_broker_and_patches_nothing(tmp_path: Path,
                                                                                listener: socket.socket) -> None:
    bootstrap = f"127.0.0.1:{listener.getsockname()[1]}"
    out = _run("import clocktower.streams.app, clocktower.streams.__main__\n" + UNPATCHED, tmp_path, bootstrap)
    assert out.returncode == 0, out.stderr[-2000:]    # no control key in tmp_path
    assert json.loads(out.stdout) == {"fetcher": "Fetcher", "faust_fixed": False, "join_guarded": False}
    assert _connections(listener) == 0
    # the listener does see a client that connects: without this, a listener that saw nothing would prove nothing
    control = ("from clocktower.streams.command_topic import command_partitions\n"
               f"command_partitions({bootstrap!r}, {{}}, 1)")
    assert _run(control, tmp_path, bootstrap).returncode == 0
    assert _connections(listener) >= 1


def test_build_app_without_a_control_key_stops_before_the_network(tmp_path: Path, listener: socket.socket) -> None:
    bootstrap = f"127.0.0.1:{listener.getsockname()[1]}"
    code = ("from clocktower.streams.app import build_app\nfrom clocktower.streams.settings import StreamsSettings\n"
            "from clocktower.runtime.errors import UserError\n"
            "try:\n    build_app(StreamsSettings())\n"
            "except UserError as exc:\n    print('refused:', exc)\n" + UNPATCHED)
    out = _run(code, tmp_path, bootstrap)
    assert out.returncode == 0, out.stderr[-2000:]
    refused, state = out.stdout.splitlines()
    assert refused.startswith("refused:") and "control" in refused
    assert json.loads(state) == {"fetcher": "Fetcher", "faust_fixed": False, "join_guarded": False}
    assert _connections(listener) == 0


def test_build_app_wires_an_agent_per_topic_and_a_table_per_durable_processor(tmp_path: Path,
                                                                             listener: socket.socket) -> None:
    ensure_control_keys(tmp_path)
    bootstrap = f"127.0.0.1:{listener.getsockname()[1]}"
    code = ("import clocktower.streams.app as a\nfrom clocktower.streams.settings import StreamsSettings\n"
            "from clocktower.streams.table_memory import table_options\n"
            "a.command_partitions = lambda *args, **kw: 4   # the broker's answer, without a broker\n"
            "app = a.build_app(StreamsSettings())\n"
            "print(json.dumps({'topics': sorted(t for ag in app.agents.values() for t in ag.channel.topics),\n"
            "                  'changelogs': sorted(t.changelog_topic.get_topic_name() for t in app.tables.values()),\n"
            "                  'bounded': all(t.options == table_options() for t in app.tables.values())}))\n"
            + UNPATCHED)
    out = _run(code, tmp_path, bootstrap)
    assert out.returncode == 0, out.stderr[-2000:]
    wired, state = out.stdout.splitlines()
    assert json.loads(wired) == {"topics": sorted(streams_reads()),
                                 "changelogs": sorted(changelog_topic(c) for c in PROCESSORS if c.durable),
                                 "bounded": True}   # RocksDB memory bounded (streams/table_memory.py)
    assert json.loads(state) == {"fetcher": "IdleBackoffFetcher", "faust_fixed": True, "join_guarded": True}
