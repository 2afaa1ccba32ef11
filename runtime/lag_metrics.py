"""Consumer lag as a Prometheus metric: read from the broker when scraped, at most once per `ttl_s`.

`clocktower_consumer_lag_records{group,topic,partition}` is what each group has yet to commit (runtime/
consumer_lag.py). The sink exports its group's, the streams theirs. A scrape never waits long for a broker that is
away: the read is bounded by `timeout_s`, and a failed read exports no lag but counts in
`clocktower_consumer_lag_read_errors_total`, so an alert on lag does not go quiet unnoticed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping

from prometheus_client import REGISTRY, Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from clocktower.runtime.consumer_lag import consumer_lag
from clocktower.schemas.kafka_security import KafkaSecurity

log = logging.getLogger(__name__)
READ_ERRORS = Counter("clocktower_consumer_lag_read_errors_total", "consumer lag reads that failed", ["group"])


class ConsumerLagCollector(Collector):
    def __init__(self, bootstrap: str, readers: Mapping[str, Collection[str]], security: KafkaSecurity | None = None,
                 ttl_s: float = 5.0, timeout_s: float = 3.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.bootstrap, self.readers, self.security = bootstrap, readers, security
        self.ttl_s, self.timeout_s, self.clock = ttl_s, timeout_s, clock
        self._rows: list[dict] = []
        self._read_at: float | None = None
        self._lock = threading.Lock()

    def rows(self) -> list[dict]:
        with self._lock:
            if self._read_at is None or self.clock() - self._read_at >= self.ttl_s:
                self._read_at = self.clock()
                try:
                    self._rows = consumer_lag(self.bootstrap, self.readers, self.timeout_s, self.security)
                except Exception as exc:  # noqa: BLE001 - a scrape must answer: no lag, an error counted
                    log.warning("consumer lag not read: %s", exc)
                    for g in self.readers:
                        READ_ERRORS.labels(g).inc()
                    self._rows = []
            return self._rows

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily("clocktower_consumer_lag_records",
                                   "records a consumer group has yet to commit, per topic and partition",
                                   labels=["group", "topic", "partition"])
        for r in self.rows():
            family.add_metric([r["group"], r["topic"], str(r["partition"])], r["lag"])
        yield family


def export_lag(bootstrap: str, readers: Mapping[str, Collection[str]], security: KafkaSecurity | None = None,
               registry: CollectorRegistry = REGISTRY) -> ConsumerLagCollector:
    collector = ConsumerLagCollector(bootstrap, readers, security)
    registry.register(collector)
    return collector
