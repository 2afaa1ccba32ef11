"""`python -m clocktower.sinks.clickhouse`: run the Kafka -> ClickHouse sink until SIGTERM/SIGINT.

Configuration comes from CLOCKTOWER_* variables (sinks/clickhouse/settings.py).
SIGTERM flushes pending batches and commits before exiting.
"""

from __future__ import annotations

import logging
import signal
import threading

from prometheus_client import start_http_server

from clocktower.runtime.clickhouse_client import http_client
from clocktower.runtime.lag_metrics import export_lag
from clocktower.runtime.parent_watch import watch_parent
from clocktower.runtime.settings_help import ALSO_READ, service_parser
from clocktower.schemas.clickhouse_ddl import Layout
from clocktower.schemas.record_mac import NodeSigning
from clocktower.schemas.topics import TOPICS
from clocktower.sinks.clickhouse.batch_set import FlushPolicy
from clocktower.sinks.clickhouse.kafka_sink import GROUP_ID, KafkaClickHouseSink
from clocktower.sinks.clickhouse.partition_batch import warm_up
from clocktower.sinks.clickhouse.settings import SinkSettings
from clocktower.sinks.clickhouse.table_writer import TableWriter


def sink_for(s: SinkSettings, writer: TableWriter) -> KafkaClickHouseSink:
    """The sink `s` configures, with its broker profile's workarounds."""
    return KafkaClickHouseSink(s.bootstrap, writer, policy=FlushPolicy(s.flush_rows, s.flush_interval_s),
                               instance_id=s.sink_instance_id, max_future_skew_ns=s.max_future_skew_ns,
                               idle_backoff_s=s.workarounds.idle_fetch_backoff_s,
                               trickle_backoff_s=s.workarounds.sink_trickle_backoff_s,
                               check_reused_offsets=s.workarounds.check_reused_offsets,
                               consumer_extra=s.workarounds.librdkafka_consumer(),
                               producer_key=NodeSigning().producer_key_bytes())   # flags rows no node signed


def main(argv: list[str] | None = None) -> None:
    service_parser("python -m clocktower.sinks.clickhouse", "The Kafka -> ClickHouse sink: runs until SIGTERM/SIGINT, "
                   "which flushes pending batches and commits.", SinkSettings, ALSO_READ).parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s sink %(levelname)s %(message)s")
    watch_parent()
    s = SinkSettings()
    if s.metrics_port:
        export_lag(s.bootstrap, {GROUP_ID: [t.name for t in TOPICS]})   # its own group's lag
        start_http_server(s.metrics_port, addr=s.metrics_host)
    client = http_client(s.clickhouse, *s.clickhouse_login(), s.clickhouse_database)
    writer = TableWriter(client, layout=Layout(s.clickhouse_database, s.clickhouse_cluster))
    writer.ensure_schema()
    warm_up()
    sink = sink_for(s, writer)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    sink.run(stop)
    logging.info("sink stopped: %d rows inserted, %d dead letters", sink.rows_inserted, sink.deadlettered)


if __name__ == "__main__":
    main()
