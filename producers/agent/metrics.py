"""The node agent's Prometheus metrics (CLOCKTOWER_AGENT_METRICS_PORT; the actuator's are served beside them)."""

from prometheus_client import Counter, Gauge

EVENTS = Counter("clocktower_agent_events_total", "events handed to Kafka (or its spool), by schema", ["schema"])
REFUSED = Counter("clocktower_agent_events_refused_total", "events the publisher refused (too big for a record)",
                  ["schema"])
DROPPED = Counter("clocktower_agent_events_dropped_total", "events lost because the publisher failed")
SPOOL_RECORDS = Gauge("clocktower_agent_spool_records", "records waiting in the spool for the broker")
SPOOL_EVENTS = Gauge("clocktower_agent_spool_events", "events in the records waiting in the spool")
