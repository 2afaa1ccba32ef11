"""kill -9 the sink mid-run, restart it, and the row counts are still exact."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from clocktower.drain import wait_drained
from clocktower.producers.kafka_publisher import KafkaPublisher
from clocktower.producers.simulator import FleetSimulator, SimConfig
from clocktower.schemas.topics import BY_SCHEMA
from clocktower.summary import table_rows

pytestmark = pytest.mark.e2e


def test_sink_killed_mid_run_loses_and_doubles_nothing(pipeline_without_streams) -> None:
    p = pipeline_without_streams
    s, client, stack = p.settings, p.client, p.stack
    publisher = KafkaPublisher(s.bootstrap, max_events_per_record=200)
    sim = FleetSimulator(SimConfig(nodes=2, duration_s=12, seed=3))
    produced: dict[str, int] = {}
    done = threading.Event()

    def produce() -> None:
        # 100 ms of simulated time per publish, paced to last ~18 s: long enough for restarts to rejoin
        step = 10**8
        end = sim.now_ns + 12 * 10**9
        while sim.now_ns < end:
            events = sim.advance(sim.now_ns + step)
            for e in events:
                produced[type(e).SCHEMA] = produced.get(type(e).SCHEMA, 0) + 1
            publisher.publish(events)
            time.sleep(0.15)
        publisher.flush(30)
        done.set()

    thread = threading.Thread(target=produce)
    thread.start()
    kills = 0
    sink = stack.children["sink"]
    rows_at_kill = 0
    while not done.is_set() and kills < 3:
        time.sleep(1.0)
        stored = sum(table_rows(client).values()) if _tables_exist(client) else 0
        if stored > rows_at_kill:  # the (restarted) sink is inserting: kill it in the middle of that
            rows_at_kill = stored
            os.kill(sink.pid, signal.SIGKILL)
            sink.proc.wait()
            kills += 1
            assert stack.supervise() == ["sink"]   # the supervisor restarts it
    thread.join()
    assert kills >= 2, "the sink must have been killed while data was flowing"
    assert wait_drained(s.bootstrap, 120, check=stack.supervise, with_streams=False)
    rows = table_rows(client)
    for schema, n in produced.items():
        assert rows[BY_SCHEMA[schema].table] == n, f"{schema}: produced {n}, stored {rows[BY_SCHEMA[schema].table]}"
    assert publisher.failed == {}


def _tables_exist(client) -> bool:
    return bool(client.query("SELECT count() FROM system.tables WHERE name = 'deadletter'").result_rows[0][0])
