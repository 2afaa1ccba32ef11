"""The sink's own Prometheus metrics."""

from prometheus_client import Counter, Histogram

RECORDS = Counter("clocktower_sink_records_total", "Kafka records consumed", ["topic"])
ROWS = Counter("clocktower_sink_rows_total", "rows inserted into ClickHouse", ["table"])
DEADLETTERS = Counter("clocktower_sink_deadletters_total", "records rejected to deadletter", ["topic"])
FLUSH_SECONDS = Histogram("clocktower_sink_flush_seconds", "time to insert one partition batch (on the insert thread)")
DEADLETTER_FAILURES = Counter("clocktower_sink_deadletter_failures_total",
                              "rejected records skipped because their dead letter could not be built or queued",
                              ["topic"])
LOST_RECORDS = Counter("clocktower_sink_broker_lost_records_total",
                       "stored or committed offsets whose records the broker lost (their offsets reused or gone)",
                       ["topic"])
DELETED_ROWS = Counter("clocktower_sink_lost_rows_deleted_total",
                       "rows deleted because the broker lost the records they came from", ["topic"])
