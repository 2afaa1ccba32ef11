"""N stream workers give the answers of one, and a worker killed with kill -9 loses nothing.

One simulated run (fixed seed, faults on) is published in real time through the real broker, streams
and sink into the real ClickHouse engine: once through 1 worker, once through 3 (`python -m
clocktower.streams` processes with distinct static member ids), and once through 3 of which one is
killed with SIGKILL mid-run and restarted 5 s later. telemetry.flows has 6 partitions, so each of the 3
workers owns some of every processor's partitions. The fleet's replacement budget (one, in the replacement
allocator) grants requests in the order they reach it, which differs between runs, so it is raised here to keep
it out of the comparison. The straggler detector judges each iteration once all its ranks are in, so its rows
are compared, except for a rank on a GPU with a thermal fault: whether its slow iterations fold into the thermal
incident depends on whether that incident was read before them (two topics, read in arrival order). Congestion
(a link's delay floor and queue EWMA, and the QoS commands it orders) still judges samples in the order they
arrive from several joins: its rows and commands are left out of the row-by-row comparison (issue 20's next step
is to judge it by event-time windows). Every run accounts
for its input: each record of every topic the streams read, from
its partition's start to its end, reached a processor at least once (streams/handled_audit.py), so a record
skipped in a rebalance fails the run even when the lag reaches 0 (issue 17).
"""

from __future__ import annotations

import functools
import os
import signal
import time
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from clocktower.drain import wait_drained
from clocktower.producers.kafka_publisher import KafkaPublisher
from clocktower.producers.simulator import FleetSimulator, SimConfig, run_simulation
from clocktower.producers.simulator.fault_schedule import FaultSchedule
from clocktower.producers.simulator.topology import JOB_ID, Topology
from clocktower.runtime.credentials import control_key_path, control_public_key_path
from clocktower.runtime.private_file import create_private_file
from clocktower.schemas.topics import BY_NAME
from clocktower.streams.handled_audit import handled
from clocktower.streams.registry import APP_ID, streams_reads
from clocktower.topic_admin import READERS, consumer_lag
from tests.conftest import Pipeline, start_pipeline
from tests.control_keys import TEST_PUBLIC_PEM, private_pem

pytestmark = pytest.mark.e2e

# 6 nodes of 2 GPUs: every processor has work (flows, 12 ranks, flaps, GPU faults, 15 probe edges) that 3 workers,
# the broker, ClickHouse and the sink get through on 2 cores.
SIM = SimConfig(nodes=6, gpus_per_node=2, gpu_health_hz=2.0, duration_s=12, seed=11)
S = 1_000_000_000
# Lost GPUs are replaced only for faults at most this old on the workers' clocks (the default is 900 s): every run of
# the module starts its fleet at the same time, set when the first run starts, so the last run's faults are older.
MAX_FAULT_AGE_S = 3000


@functools.cache
def start_ns() -> int:
    """One start for every run of this module (event times, and so incident and command ids, match across runs),
    set by the first run: 5 minutes back, so no event is stamped in the future, and the runs that follow within
    the next 45 minutes still have their GPU faults acted on."""
    return (time.time_ns() // S - 300) * S


def test_flows_are_spread_over_six_partitions() -> None:
    assert BY_NAME["telemetry.flows"].partitions >= 6


def _members(bootstrap: str) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    group = admin.describe_consumer_groups([APP_ID])[APP_ID].result(10)
    return len(group.members) if str(group.state).endswith("STABLE") else 0


def _run(data_dir: Path, workers: int, kill_at_s: float | None = None) -> tuple[dict[str, list], FleetSimulator]:
    data_dir.mkdir(parents=True)
    create_private_file(control_key_path(data_dir), private_pem())   # one key for all runs: same signatures
    create_private_file(control_public_key_path(data_dir), TEST_PUBLIC_PEM)
    audit = data_dir / "handled"
    p: Pipeline = start_pipeline(data_dir, with_streams=False, worker_env={
        "CLOCKTOWER_REMEDIATION_MAX_PER_HOUR": "1000", "CLOCKTOWER_STREAMS_AUDIT_DIR": str(audit),
        "CLOCKTOWER_STREAMS_MAX_FAULT_AGE_S": str(MAX_FAULT_AGE_S), "CLOCKTOWER_STREAMS_KNOWN_AFTER_S": "0",
        # no worker ticks (control.ticks) during the run: one published after the drain, not yet handled, would be
        # counted as a record never handed to a processor by the audit below
        "CLOCKTOWER_STREAMS_TICK_S": "3600"})
    try:
        children = [p.stack.start_worker("streams", i) for i in range(1, workers + 1)]
        deadline = time.monotonic() + 90
        while _members(p.settings.bootstrap) != workers:
            assert time.monotonic() < deadline, f"{workers} stream workers never formed a stable group"
            time.sleep(0.5)
        sim = FleetSimulator(SIM, start_ns=start_ns())
        killed: dict[str, float] = {}
        wall0 = time.monotonic()

        def on_tick(s: FleetSimulator) -> None:
            elapsed = (s.now_ns - sim.start_ns) / S
            time.sleep(max(0.0, elapsed - (time.monotonic() - wall0)))   # published at the pace of real time
            if kill_at_s is not None and not killed and elapsed >= kill_at_s:
                victim = p.stack.children[children[-1]]
                os.kill(victim.pid, signal.SIGKILL)
                victim.proc.wait()
                killed["at"] = time.monotonic()
            if "at" in killed and "restarted" not in killed and time.monotonic() - killed["at"] >= 5:
                assert p.stack.supervise() == [children[-1]]
                killed["restarted"] = time.monotonic()

        publisher = KafkaPublisher(p.settings.bootstrap)
        run_simulation(sim, publisher, SIM.duration_s, realtime=False, on_tick=on_tick)
        assert publisher.flush() == 0
        if kill_at_s is not None:
            assert "restarted" in killed, "the run ended before the killed worker was restarted"
        assert wait_drained(p.settings.bootstrap, 180, check=p.stack.supervise), _stuck(p)
        _every_record_handled(p.settings.bootstrap, audit)
        return _results(p), sim
    finally:
        p.stack.stop()


def _stuck(p: Pipeline) -> str:
    """Why a run never drained: the partitions with lag, and the end of each worker's log (CI keeps no files)."""
    try:
        stuck: object = [r for r in consumer_lag(p.settings.bootstrap, READERS) if r["lag"]]
    except Exception as exc:  # noqa: BLE001 - the message must not hide the failure it explains
        stuck = f"(the lag could not be read: {exc!r})"
    logs = "\n".join(f"--- {name} ---\n{c.log_tail(40)}" for name, c in p.stack.children.items()
                     if name.startswith(("streams", "sink")))
    return f"the pipeline never drained; lagging: {stuck}\n{logs}"


def _every_record_handled(bootstrap: str, audit: Path) -> None:
    """Every offset of every partition the streams read, start to end, reached a processor (any worker's audit)."""
    seen = handled(audit)
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "test-audit", "enable.auto.commit": False})
    try:
        missing, total = {}, 0
        for topic in streams_reads():
            for partition in c.list_topics(topic, timeout=10).topics[topic].partitions:
                low, high = c.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
                gap = set(range(low, high)) - seen.get((topic, partition), set())
                total += high - low
                if gap:
                    missing[f"{topic}:{partition}"] = (min(gap), max(gap), len(gap))
    finally:
        c.close()
    assert total > 0 and not missing, f"records never handed to a processor (first, last, count): {missing}"


NOT_ORIGIN = "EXCEPT (_topic, _partition, _offset)"   # where a row was read from differs between runs
# rows judged on arrival order (the module's docstring): not compared row by row
_TOPO = Topology(SIM.nodes, SIM.gpus_per_node)
THERMAL_RANKS = ", ".join(f"'{JOB_ID}:rank{_TOPO.rank(w.node, w.gpu)}'"
                          for w in FaultSchedule(SIM, _TOPO, 10**18).by_kind("gpu_thermal"))
ORDER_FREE = (f"NOT (kind = 'congestion' OR position(detail, 'while throttled') > 0 "
              f"OR (kind = 'straggler' AND target IN ({THERMAL_RANKS})))")
# and a command's expiry (so its signature): it is dated from when the command was issued, on the worker's clock
NOT_ISSUED = "EXCEPT (_topic, _partition, _offset, expires_ns, signature)"


def _results(p: Pipeline) -> dict[str, list]:
    q = lambda sql: [tuple(r) for r in p.client.query(sql).result_rows]  # noqa: E731
    return {
        "flow_samples": q("SELECT count() FROM flow_samples"),
        "flow_latency": q("SELECT src_ip, dst_ip, src_port, dst_port, proto, seq, node, src_node, bytes, tx_ns, rx_ns,"
                          " latency_ns FROM flow_latency FINAL ORDER BY ALL"),
        "corrected": q("SELECT src_ip, dst_ip, src_port, dst_port, proto, seq, corrected_latency_ns, error_bound_ns"
                       " FROM flow_latency FINAL WHERE clock_corrected ORDER BY ALL"),
        "corrected_truth": q("SELECT node, src_node, tx_ns, rx_ns, corrected_latency_ns, error_bound_ns"
                             " FROM flow_latency FINAL WHERE clock_corrected"),
        "iteration_breakdown": q(f"SELECT * {NOT_ORIGIN} FROM iteration_breakdown FINAL ORDER BY ALL"),
        "clock_estimates": q("SELECT node, reference, ts_ns, offset_ns, error_bound_ns FROM clock_estimates"
                             " ORDER BY ALL"),
        "incidents": q(f"SELECT * {NOT_ORIGIN} FROM incidents FINAL WHERE {ORDER_FREE} ORDER BY ALL"),
        "control_commands": q(f"SELECT * {NOT_ISSUED} FROM control_commands FINAL "
                              "WHERE action NOT IN ('rate_limit', 'pause', 'resume', 'redirect') ORDER BY ALL"),
        "drains": q("SELECT count() FROM control_commands FINAL WHERE action = 'drain'"),
    }


@pytest.fixture(scope="module")
def one_worker(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, list], FleetSimulator]:
    return _run(tmp_path_factory.mktemp("one") / "ct", 1)


def _same_answers(one: dict[str, list], many: dict[str, list], min_shared: float = 0.3) -> None:
    for table in ("flow_latency", "iteration_breakdown", "incidents", "control_commands"):
        if many[table] != one[table]:   # (what differs: only worked out on a failure)
            a, b = Counter(map(repr, one[table])), Counter(map(repr, many[table]))   # (rows may hold lists)
            mine, theirs = list((b - a).elements())[:3], list((a - b).elements())[:3]
            raise AssertionError(f"{table} differs: {len(many[table])} rows vs {len(one[table])}; only in this run: "
                                 f"{mine}; only in one worker's: {theirs}")
    # corrected latencies: each run within its stated bound, so two runs within the sum of the bounds. Rows
    # joined before a worker had its first estimates stay uncorrected, and the estimates take a hop more with
    # several workers (1-2 s at the start on this 2-core machine, more under a full test run's load): at least a
    # third of the rows in both (seen: 54-89 %); each run's corrected rows are checked against the truth below.
    a = {r[:6]: r[6:] for r in one["corrected"]}
    shared = [(a[r[:6]], r[6:]) for r in many["corrected"] if r[:6] in a]
    assert (shared or not min_shared) and len(shared) >= min_shared * len(one["flow_latency"]), (
        len(one["corrected"]), len(many["corrected"]))
    for (lat1, b1), (lat2, b2) in shared:
        assert abs(lat1 - lat2) <= b1 + b2 + 2


def _latency_within_bounds(results: dict[str, list], sim: FleetSimulator, some: bool = True) -> None:
    """Every corrected one-way delay within its stated error bound of the simulator's true delay (and, if `some`,
    at least one corrected)."""
    rows = results["corrected_truth"]
    assert rows or not some
    for node, src_node, tx_ns, rx_ns, corrected, bound in rows:
        true = sim.clocks[node].to_true(rx_ns) - sim.clocks[src_node].to_true(tx_ns)
        assert abs(corrected - true) <= bound + 2, (node, src_node, tx_ns, corrected, true, bound)


def _clocks_within_bounds(results: dict[str, list], sim: FleetSimulator) -> None:
    """Every estimate within its stated error bound of the simulator's true offset, for every node."""
    rows = results["clock_estimates"]
    assert {r[0] for r in rows} == set(sim.clocks), "every node gets estimates"
    for node, reference, ts_ns, offset_ns, bound_ns in rows:
        ref = sim.clocks[reference]
        t = ref.to_true(ts_ns)
        truth = sim.clocks[node].offset_ns(t) - ref.offset_ns(t)
        assert abs(offset_ns - truth) <= bound_ns + 1, (node, ts_ns, offset_ns, truth, bound_ns)


def test_three_workers_give_the_answers_of_one(one_worker, tmp_path: Path) -> None:
    one, sim = one_worker
    assert one["flow_latency"] and one["iteration_breakdown"] and one["incidents"] and one["control_commands"]
    assert one["drains"][0][0] > 0, "the lost GPUs' nodes are drained"
    assert any("straggler" in row for row in one["incidents"]), "the straggler's rows are among those compared"
    _clocks_within_bounds(one, sim)
    many, sim3 = _run(tmp_path / "ct", 3)
    _same_answers(one, many)
    _clocks_within_bounds(many, sim3)
    _latency_within_bounds(one, sim)
    _latency_within_bounds(many, sim3)


def test_a_worker_killed_mid_run_loses_no_join(one_worker, tmp_path: Path) -> None:
    one, _ = one_worker
    killed, sim = _run(tmp_path / "ct", 3, kill_at_s=3.0)
    assert len(killed["flow_latency"]) * 2 == killed["flow_samples"][0][0]
    # The killed run's corrected rows are not required: a row is corrected only if the worker that joins it has
    # both ends' clock estimates by then. Likely cause when there are none: the worker killed at 3 s ran the clock
    # solve before any estimate was out (a loaded machine), the survivors joined their flows before its restart,
    # and it replayed its flow backlog alongside its clock backlog. Seen once in 15 loaded runs (issue 17): no
    # corrected row, with every record handled (the audit in _run) and the same joins as one worker. Corrected rows
    # are all checked against the truth, and those corrected in both runs against each other.
    _same_answers(one, killed, min_shared=0.0)
    _clocks_within_bounds(killed, sim)
    _latency_within_bounds(killed, sim, some=False)
