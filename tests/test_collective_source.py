"""Each all-reduce is counted once although the comm hook and the flight recorder both report it (issue 9 item 8).

Against the real engine: a `collectives` table made before rows carried `source` gets the column at sink start
(old flight-recorder rows read "flight_recorder"), and every dashboard query over `collectives` sums the
hook's bytes only, old rows and new.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest

from clocktower.dashboards import DASHBOARDS
from clocktower.schemas.clickhouse_ddl import KAFKA_COLUMNS, create_table_sql
from clocktower.schemas.columns import model_columns
from clocktower.schemas.telemetry import CollectiveEvent, IterationEvent
from clocktower.schemas.topics import BY_MODEL
from clocktower.sinks.clickhouse.batch_set import BatchSet
from clocktower.sinks.clickhouse.table_writer import TableWriter
from tests.grafana_plugin import ALL, QueryContext, interpolate

BUCKET = 1_048_576


def _collective(now: int, seq: int, source: str) -> CollectiveEvent:
    communicator = "fr:default" if source == "flight_recorder" else "default"
    return CollectiveEvent(node="n1", ts_ns=now, job="new", rank=0, communicator=communicator, op="allreduce",
                           seq=seq, bytes=BUCKET, start_ns=now - 1000, end_ns=now, source=source)


def _old_table(spec, drop: str) -> str:  # noqa: ANN001
    """The table as the version before `drop` existed made it."""
    return "\n".join(line for line in create_table_sql(spec)[0].splitlines() if f"`{drop}`" not in line).replace(
        ",\n)", "\n)")


def _collective_queries() -> list[tuple[str, str]]:
    return [(p.title, p.sql) for d in DASHBOARDS for p in d.panels
            if "collectives" in p.sql.split("FROM", 1)[-1] and "bytes_per_s" in p.sql]


@pytest.fixture(scope="module")
def engine(tmp_path_factory):  # noqa: ANN001, ANN201
    from tests.conftest import start_services

    services = start_services(tmp_path_factory.mktemp("collective-source"))
    try:
        yield services
    finally:
        services.stack.stop()


def test_old_tables_get_the_new_columns_and_dashboards_count_each_allreduce_once(engine) -> None:  # noqa: ANN001
    client = engine.client
    spec, it_spec = BY_MODEL[CollectiveEvent], BY_MODEL[IterationEvent]
    client.command(_old_table(spec, "source"))
    client.command(_old_table(it_spec, "collectives"))
    now = time.time_ns()
    # an old run with the flight recorder on: one all-reduce, reported by the hook and by the recorder
    client.command(
        "INSERT INTO collectives (node, ts_ns, job, rank, communicator, op, seq, bytes, start_ns, end_ns, "
        f"_partition, _offset, _topic) VALUES ('n1', {now}, 'old', 0, 'default', 'allreduce', 0, {BUCKET}, {now}, "
        f"{now}, 0, 0, 'telemetry.collectives'), ('n1', {now}, 'old', 0, 'fr:default', 'allreduce', 1, {BUCKET}, "
        f"{now}, {now}, 0, 1, 'telemetry.collectives')")

    writer = TableWriter(client)
    writer.ensure_schema()
    for s in (spec, it_spec):
        described = [(r[0], r[1]) for r in client.query(f"DESCRIBE TABLE `{s.table}`").result_rows]
        assert described == [(c.name, c.ch_type) for c in model_columns(s.model)] + list(KAFKA_COLUMNS) + [
            ("time", "DateTime64(9)")], s.table
    got = client.query("SELECT communicator, source FROM collectives WHERE job = 'old' ORDER BY seq").result_rows
    assert got == [("default", "hook"), ("fr:default", "flight_recorder")]

    # a new run: 3 buckets from the hook, the same 3 all-reduces from the flight recorder
    batches = BatchSet()
    events = [_collective(now, i, "hook") for i in range(3)] + [_collective(now, i + 1, "flight_recorder")
                                                                for i in range(3)]
    for offset, e in enumerate(events, start=2):
        batches.add(spec.name, 0, offset, [e])
    for batch in batches.take()[0]:
        writer.insert(batch)
    assert client.query("SELECT sum(bytes) FROM collectives").result_rows[0][0] == 8 * BUCKET   # both sources

    queries = _collective_queries()
    assert queries, "no dashboard panel shows collective traffic"
    for title, sql in queries:
        now = datetime.now(UTC)
        ctx = QueryContext(now - timedelta(hours=1), now + timedelta(minutes=1), 10, {"job": [ALL], "node": [ALL]})
        result = client.query(interpolate(sql, ctx))
        col = result.column_names.index("bytes_per_s")
        job = result.column_names.index("job")
        per_job: dict[str, float] = {}
        for row in result.result_rows:
            per_job[row[job]] = per_job.get(row[job], 0.0) + row[col] * 10       # the 10 s $__interval_s
        assert per_job == {"old": BUCKET, "new": 3 * BUCKET}, title


T0_FR = 1_780_000_000 * 10**9


def test_old_flight_recorder_records_decode_with_their_source() -> None:
    old = {"node": "n", "ts_ns": T0_FR, "job": "j", "rank": 0, "op": "allreduce", "seq": 1, "bytes": 8,
           "start_ns": T0_FR, "end_ns": T0_FR}
    assert CollectiveEvent(**old, communicator="fr:default").source == "flight_recorder"
    assert CollectiveEvent(**old, communicator="default").source == "hook"
    it = IterationEvent(node="n", ts_ns=T0_FR, job="j", rank=0, iteration=0, start_ns=T0_FR, end_ns=T0_FR)
    assert it.collectives is None
