"""A simulated fleet run in the real engine: what the dashboard, rollup and migration tests query.

A 4-node run with every kind of fault, through the stream processors in memory, its commands applied by real
actuators on simulated ports, inserted by the sink's TableWriter (so the rollups' views see the inserts) into the
embedded endpoint. Built once per test session (tests/conftest.py's `simulated_fleet`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from clickhouse_connect.driver.client import Client

from clocktower.demo_actuators import demo_hooks, simulated_node_actuator
from clocktower.producers.simulator.config import SimConfig
from clocktower.producers.simulator.fleet import FleetSimulator
from clocktower.runtime.clickhouse_client import http_client
from clocktower.runtime.credentials import DASHBOARDS_USER, credentials_path, read_users
from clocktower.schemas.control import ControlCommand
from clocktower.schemas.topics import BY_MODEL
from clocktower.sinks.clickhouse.batch_set import BatchSet
from clocktower.sinks.clickhouse.table_writer import TableWriter
from clocktower.streams.processors import Processors
from tests.control_keys import TEST_SIGNER

SECONDS = 40          # the default fault schedule fits every kind of fault in it
NODES = 4


@dataclass(frozen=True)
class SimulatedFleet:
    admin: Client        # the sink's read-write login
    reader: Client       # the read-only `dashboards` login Grafana uses
    start: datetime      # a time range that holds every row
    end: datetime


def simulated_events(state_dir: Path) -> list:
    start_ns = time.time_ns() - (SECONDS + 5) * 10**9
    sim = FleetSimulator(SimConfig(nodes=NODES, duration_s=SECONDS, seed=3), start_ns=start_ns)
    processors = Processors(TEST_SIGNER, clock_ns=lambda: sim.now_ns)
    events: list = []
    for step in range(1, 4 * SECONDS + 1):
        batch = sim.advance(start_ns + step * 250_000_000)
        events += batch
        events += processors.on_batch(batch)
    actuators = {}
    hooks = demo_hooks()
    for cmd in [e for e in events if isinstance(e, ControlCommand)]:
        if cmd.node not in actuators:
            actuators[cmd.node] = simulated_node_actuator(cmd.node, TEST_SIGNER.verifier(), state_dir / cmd.node,
                                                          hooks)
        events.append(actuators[cmd.node].handle(cmd))
    return events


def load(client: Client, settings, state_dir: Path) -> SimulatedFleet:  # noqa: ANN001 (clocktower.config.Settings)
    writer = TableWriter(client)
    writer.ensure_schema()
    batches = BatchSet()
    for offset, e in enumerate(simulated_events(state_dir)):
        batches.add(BY_MODEL[type(e)].name, 0, offset, [e])
    for batch in batches.take()[0]:
        writer.insert(batch)
    password, _ = read_users(credentials_path(settings.data_dir))[DASHBOARDS_USER]
    reader = http_client(settings.clickhouse, DASHBOARDS_USER, password)
    now = datetime.now(UTC)
    return SimulatedFleet(client, reader, now - timedelta(minutes=5), now + timedelta(seconds=5))
