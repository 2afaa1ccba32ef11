"""The stream worker's own Prometheus metrics."""

from prometheus_client import Counter, Gauge

RECORDS = Counter("clocktower_streams_records_total", "input records processed", ["topic"])
DECODE_FAILURES = Counter("clocktower_streams_decode_failures_total",
                          "input records skipped because they failed decoding (the sink dead-letters them)", ["topic"])
BATCH_FAILURES = Counter("clocktower_streams_batch_failures_total",
                         "input records whose processing raised; each is dead-lettered", ["topic"])
IDENTITY_REJECTS = Counter("clocktower_streams_identity_rejects_total",
                           "records whose key is not the node their producer proved to be; dead-lettered", ["topic"])
REMEDIATION_WITHHELD = Counter("clocktower_streams_remediation_withheld_total",
                               "drain/spare requests held for a human because the fleet budget was spent")
STATE_EXPIRED = Counter("clocktower_streams_state_expired_total",
                        "state entries dropped because their event time passed (a segment never joined, a rank gone "
                        "idle)", ["processor"])
STATE_REFUSED = Counter("clocktower_streams_state_refused_total",
                        "new state keys not kept because their partition held CLOCKTOWER_STREAMS_MAX_ENTRIES already "
                        "(a flood of invented names)", ["processor"])
PROCESSOR_COUNTS = Gauge("clocktower_streams_processor_count",
                         "a processor's running counts since the worker started (see Processor.counters)",
                         ["processor", "count"])
