"""The pipeline-health dashboard's PromQL, run on a real Prometheus scraping this process's exporters.

Prometheus is Debian's (2.42; compose runs 3.5, whose PromQL these expressions use nothing new of), unpacked by
`make setup-prometheus` into .cache/prometheus, never installed. The test moves every metric the panels read
(the actuator's and the agent's through their own code: acks, deliveries, a failed delivery, the spool wiring;
the sink's and streams' counters and the lag export directly), twice, serves them on a free loopback port, lets
Prometheus scrape them every second, and runs each panel's expression through Prometheus' query API: each must
succeed and return at least one series with a value above 0. Bounded: the server is stopped and its data removed.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import REGISTRY, start_http_server

import clocktower.sinks.clickhouse.metrics as sink_metrics
import clocktower.streams.metrics as streams_metrics
from clocktower.dashboards import DASHBOARDS
from clocktower.ports import free_port
from clocktower.runtime import lag_metrics
from tests.metric_moves import fail_to_hand, hand_to_kafka, serve_spool_metrics, signed_failover, simulated_actuator

PROMETHEUS = Path(__file__).resolve().parents[1] / ".cache" / "prometheus" / "usr" / "bin" / "prometheus"
EXPRS = [(p.title, expr) for b in DASHBOARDS for p in b.panels for expr, _ in p.promql]


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as r:   # noqa: S310 - loopback, a URL this test built
        return json.loads(r.read())


def _move_every_metric(tmp_path: Path, step: int) -> None:
    """One round of what production does to each metric the panels read."""
    act = simulated_actuator(tmp_path / f"a{step}")
    act.handle(signed_failover(f"promql-{step}", issued_s_ago=0.1))
    act.close()
    hand_to_kafka(5)
    fail_to_hand(1)
    serve_spool_metrics(records=3, events=30)
    sink_metrics.RECORDS.labels("telemetry.gpu").inc(100)
    sink_metrics.ROWS.labels("gpu_health").inc(100)
    sink_metrics.DEADLETTERS.labels("telemetry.gpu").inc()
    sink_metrics.FLUSH_SECONDS.observe(0.02)
    streams_metrics.RECORDS.labels("telemetry.gpu").inc(100)
    streams_metrics.DECODE_FAILURES.labels("telemetry.gpu").inc()
    streams_metrics.BATCH_FAILURES.labels("telemetry.gpu").inc()
    lag_metrics.READ_ERRORS.labels("clocktower-sink").inc()


@pytest.fixture
def prometheus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    if not PROMETHEUS.exists():
        pytest.skip("no Prometheus binary at .cache/prometheus (`make setup-prometheus` unpacks Debian's package)")
    monkeypatch.setattr(lag_metrics, "consumer_lag", lambda *a, **k: [
        {"group": "clocktower-sink", "topic": "telemetry.gpu", "partition": 0, "lag": 42}])
    collector = lag_metrics.export_lag("127.0.0.1:1", {"clocktower-sink": ["telemetry.gpu"]})
    server = proc = None
    log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115 - closed below, after the server
    try:
        exporter_port, prom_port = free_port(), free_port()
        server, _ = start_http_server(exporter_port, addr="127.0.0.1")
        config = tmp_path / "prometheus.yml"
        config.write_text(f"global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: clocktower\n"
                          f"    static_configs:\n      - targets: ['127.0.0.1:{exporter_port}']\n")
        proc = subprocess.Popen([str(PROMETHEUS), f"--config.file={config}",
                                 f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                 f"--web.listen-address=127.0.0.1:{prom_port}"], stdout=subprocess.DEVNULL, stderr=log)
        base = f"http://127.0.0.1:{prom_port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                if urllib.request.urlopen(f"{base}/-/ready", timeout=2).status == 200:   # noqa: S310
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, (tmp_path / "prometheus.log").read_text()
            time.sleep(0.2)
        yield base
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if server is not None:
            server.shutdown()
            server.server_close()
        log.close()
        REGISTRY.unregister(collector)


def _scraped(base: str, expr: str, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _get(f"{base}/api/v1/query?query={urllib.parse.quote(expr)}")["data"]["result"]:
            return True
        time.sleep(0.5)
    return False


def test_every_pipeline_health_panel_query_runs_on_prometheus_and_returns_series(prometheus, tmp_path) -> None:
    assert len(EXPRS) >= 10
    _move_every_metric(tmp_path, 0)
    assert _scraped(prometheus, "clocktower_actuator_commands_total"), "Prometheus never scraped the exporter"
    time.sleep(2.5)                      # a later scrape, after the counters moved again: every rate() has two points
    _move_every_metric(tmp_path, 1)
    assert _scraped(prometheus, "rate(clocktower_actuator_commands_total[1m]) > 0")
    empty = []
    for title, expr in EXPRS:
        answer = _get(f"{prometheus}/api/v1/query?query={urllib.parse.quote(expr)}")
        assert answer["status"] == "success", (title, expr, answer)
        if not [r for r in answer["data"]["result"] if float(r["value"][1]) > 0]:   # a series that moved
            empty.append((title, expr, answer["data"]["result"]))
    assert not empty, empty
    lag = _get(f"{prometheus}/api/v1/query?query=" + urllib.parse.quote(
        "sum by (group) (clocktower_consumer_lag_records)"))["data"]["result"]
    assert [(r["metric"]["group"], r["value"][1]) for r in lag] == [("clocktower-sink", "42")]


def test_a_broken_expression_is_refused_by_prometheus(prometheus) -> None:
    """The check can fail: Prometheus answers a malformed expression with an error, not an empty result."""
    with pytest.raises(urllib.error.HTTPError):
        _get(f"{prometheus}/api/v1/query?query="
             + urllib.parse.quote("sum by (group (clocktower_consumer_lag_records)"))
