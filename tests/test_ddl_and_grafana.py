"""The DDL and the docs, checked against the real ClickHouse engine (the dashboards: test_dashboard_queries.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from clocktower.producers.simulator import FleetSimulator, SimConfig
from clocktower.schemas.clickhouse_ddl import KAFKA_COLUMNS
from clocktower.schemas.columns import model_columns
from clocktower.schemas.docs import render
from clocktower.schemas.topics import BY_MODEL, TOPICS
from clocktower.sinks.clickhouse.batch_set import BatchSet
from clocktower.sinks.clickhouse.table_writer import TableWriter

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """The engine with the schema and a few seconds of simulated fleet telemetry (all kinds of fault)."""
    from tests.conftest import start_services

    services = start_services(tmp_path_factory.mktemp("grafana"))
    try:
        writer = TableWriter(services.client)
        writer.ensure_schema()
        sim = FleetSimulator(SimConfig(nodes=2, duration_s=8, seed=5))
        batches = BatchSet()
        for offset, e in enumerate(sim.advance(sim.now_ns + 8 * 10**9)):
            batches.add(BY_MODEL[type(e)].name, 0, offset, [e])
        for batch in batches.take()[0]:
            writer.insert(batch)
        yield services
    finally:
        services.stack.stop()


def test_tables_have_exactly_the_model_columns(loaded) -> None:
    for spec in TOPICS:
        described = loaded.client.query(f"DESCRIBE TABLE `{spec.table}`").result_rows
        got = [(r[0], r[1]) for r in described]
        want = [(c.name, c.ch_type) for c in model_columns(spec.model)] + list(KAFKA_COLUMNS)
        want.append(("time", "DateTime64(9)"))
        assert got == want, spec.table


def test_schema_docs_are_generated_from_the_models() -> None:
    assert (ROOT / "docs" / "SCHEMA.md").read_text() == render(), "run `make docs`"
