"""producers.pytorch: a real 2-process gloo DDP run publishing to the embedded broker, plus unit tests.

The DDP test spawns two ranks on loopback. Each trains the same model twice from the same weights and
data: once plain DDP, once instrumented by Telemetry (comm hook, iterations, flight recorder); the
parameters must end up identical. The ranks publish to a real broker, and the test consumes and
decodes `telemetry.collectives` and `telemetry.iterations`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
import uuid
import warnings
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from clocktower.producers.pytorch.event_buffer import EventBuffer
from clocktower.producers.pytorch.flight_recorder import FlightRecorderReader, buffer_size_from_env, entry_bytes, map_op
from clocktower.producers.pytorch.iterations import IterationClock
from clocktower.schemas.telemetry import CollectiveEvent, IterationEvent
from clocktower.streams.joins.iteration_breakdown import IterationBreakdownJoin
from clocktower.streams.processor_runner import ProcessorRunner

HAVE_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed (pip install torch==2.13.0; "
                                 "`make test` installs it)")

JOB = "pytest-ddp"
ITERATIONS = 20
WIDTH = 256
LAYERS = 4
BUCKET_CAP_MB = 0.25          # one Linear(256, 256) is 257 KiB: 4 buckets once DDP has rebuilt them
PARAM_BYTES = LAYERS * (WIDTH * WIDTH + WIDTH) * 4


# --- the DDP ranks (spawned; module level so that they pickle) ------------------------------------
def _model():  # noqa: ANN202
    import torch
    return torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])


def _train_step(model, opt, x, y) -> None:  # noqa: ANN001
    import torch
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()


def _rank_main(rank: int, port: int, out_dir: str) -> None:
    import copy

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from clocktower.producers.pytorch import Telemetry

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        torch.manual_seed(0)
        base = _model()
        gen = torch.Generator().manual_seed(1000 + rank)
        batches = [(torch.randn(8, WIDTH, generator=gen), torch.randn(8, WIDTH, generator=gen))
                   for _ in range(ITERATIONS)]

        plain = DDP(copy.deepcopy(base), bucket_cap_mb=BUCKET_CAP_MB)
        opt = torch.optim.SGD(plain.parameters(), lr=0.05)
        for x, y in batches:
            _train_step(plain, opt, x, y)

        tele = Telemetry(job=JOB)                      # publisher from CLOCKTOWER_KAFKA_BOOTSTRAP
        model = tele.instrument(DDP(copy.deepcopy(base), bucket_cap_mb=BUCKET_CAP_MB))
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        t0 = time.perf_counter()
        for x, y in batches:
            with tele.iteration():
                _train_step(model, opt, x, y)
        train_s = time.perf_counter() - t0

        for (name, p), q in zip(plain.module.named_parameters(), model.module.parameters(), strict=True):
            assert torch.equal(p, q), f"rank {rank}: {name} differs from plain DDP after {ITERATIONS} steps"
        assert not torch.equal(base[0].weight, model.module[0].weight), "the model did not train"
        assert sum(p.numel() * p.element_size() for p in model.parameters()) == PARAM_BYTES

        fr = tele.dump_flight_recorder()
        pending = tele.close()
        assert pending == 0, f"rank {rank}: {pending} deliveries still pending"
        assert not tele.publisher.failed, tele.publisher.errors[:3]
        result = {"rank": rank, "fr_status": tele.flight_recorder_status, "fr_entries": fr.entries,
                  "fr_emitted": fr.emitted, "fr_skipped": dict(fr.skipped_ops), "stats": tele.stats,
                  "sent": dict(tele.publisher.sent), "train_s": train_s,
                  "fr_sample": (fr.raw or {}).get("entries", [])[-3:]}
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def _spool_rank_main(rank: int, port: int, out_dir: str, run: int) -> None:
    """One rank of an mp.spawn job whose broker is away: what it records stays in its spool."""
    import torch.distributed as dist

    from clocktower.producers.pytorch import Telemetry

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    assert "RANK" not in os.environ                          # mp.spawn sets no RANK: only torch.distributed knows
    tele = Telemetry(job="spawned", node="n1", interval_s=60)   # before the process group: spool made on first use
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        for _ in range(3):
            tele.step()
        tele.flush()
        spool = tele.publisher.spool
        found = {"dir": spool.dir.name, "pending_at_publish": spool.pending_records}
        tele.close(timeout=0.2)
        Path(out_dir, f"run{run}-rank{rank}.json").write_text(json.dumps(found))
    finally:
        dist.destroy_process_group()


@needs_torch
def test_mp_spawn_ranks_spool_per_rank_and_find_it_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under torch.multiprocessing.spawn a restarted rank reopens the spool of its rank, not one per pid."""
    import torch.multiprocessing as mp

    from clocktower.ports import free_port

    monkeypatch.setenv("CLOCKTOWER_KAFKA_BOOTSTRAP", f"127.0.0.1:{free_port()}")   # nothing listens: all spooled
    monkeypatch.setenv("CLOCKTOWER_SPOOL_DIR", str(tmp_path / "spool"))
    monkeypatch.delenv("RANK", raising=False)
    if sys.platform.startswith("linux"):
        monkeypatch.setenv("GLOO_SOCKET_IFNAME", os.environ.get("GLOO_SOCKET_IFNAME", "lo"))
    for run in (1, 2):                                     # run 2: every rank restarted
        mp.spawn(_spool_rank_main, args=(free_port(), str(tmp_path), run), nprocs=2, join=True)
    found = {(run, r): json.loads((tmp_path / f"run{run}-rank{r}.json").read_text()) for run in (1, 2) for r in (0, 1)}
    assert sorted(p.name for p in (tmp_path / "spool").iterdir()) == ["spawned-n1-rank0", "spawned-n1-rank1"]
    for r in (0, 1):
        assert found[1, r]["dir"] == found[2, r]["dir"] == f"spawned-n1-rank{r}"
        # run 2 holds run 1's undelivered records (a live broker would get them replayed) behind its own
        assert found[2, r]["pending_at_publish"] > found[1, r]["pending_at_publish"] > 0


def _consume(bootstrap: str, expected: dict[str, int], timeout: float = 30.0) -> dict[str, list]:
    from confluent_kafka import Consumer

    from clocktower.schemas.codec import decode_batch

    topics = {"telemetry.collectives": CollectiveEvent.SCHEMA, "telemetry.iterations": IterationEvent.SCHEMA}
    got: dict[str, list] = {schema: [] for schema in topics.values()}
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"test-pytorch-{uuid.uuid4().hex}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.subscribe(list(topics))
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and any(len(got[s]) < n for s, n in expected.items()):
            msg = c.poll(0.5)
            if msg is None or msg.error():
                continue
            batch = decode_batch(msg.topic(), msg.key(), msg.value(), msg.headers())
            got[batch.schema].extend(batch.events)
    finally:
        c.close()
    return got


@needs_torch
def test_ddp_gloo_two_ranks_publish_to_kafka(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.multiprocessing as mp

    from clocktower.ports import free_port
    from tests.conftest import start_services

    t0 = time.monotonic()
    services = start_services(tmp_path / "ct")
    try:
        bootstrap = services.settings.bootstrap
        monkeypatch.setenv("CLOCKTOWER_KAFKA_BOOTSTRAP", bootstrap)
        monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "4000")
        monkeypatch.setenv("CLOCKTOWER_SPOOL_DIR", str(tmp_path / "spool"))   # the default SpoolingPublisher's
        if sys.platform.startswith("linux"):
            monkeypatch.setenv("GLOO_SOCKET_IFNAME", os.environ.get("GLOO_SOCKET_IFNAME", "lo"))
        mp.spawn(_rank_main, args=(free_port(), str(tmp_path)), nprocs=2, join=True)
        t_ranks = time.monotonic() - t0
        # each rank published through its own SpoolingPublisher and closed it with nothing left to replay
        from clocktower.producers.spool import Spool
        spools = sorted((tmp_path / "spool").iterdir())
        assert [p.name.rsplit("-", 1)[1] for p in spools] == ["rank0", "rank1"]   # mp.spawn: by torch's rank
        for path in spools:
            spool = Spool(path)
            assert spool.pending_records == 0, path
            spool.close()
        results = {r: json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)}
        expected = {s: sum(res["sent"].get(s, 0) for res in results.values())
                    for s in (CollectiveEvent.SCHEMA, IterationEvent.SCHEMA)}
        got = _consume(bootstrap, expected)
    finally:
        services.stack.stop()
    per_rank = {r: {k: v for k, v in res.items() if k != "fr_sample"} for r, res in results.items()}
    print(f"\nranks done after {t_ranks:.1f} s, total {time.monotonic() - t0:.1f} s; per rank: {json.dumps(per_rank)}")
    print("flight recorder sample (rank 0):", json.dumps(results[0]["fr_sample"][-1]))

    for res in results.values():
        assert res["fr_status"] == "enabled"
        assert res["stats"]["dropped"] == res["stats"]["invalid"] == res["stats"]["publish_errors"] == 0
    assert {s: len(v) for s, v in got.items()} == expected

    iterations: list[IterationEvent] = got[IterationEvent.SCHEMA]
    collectives: list[CollectiveEvent] = got[CollectiveEvent.SCHEMA]
    assert {e.rank for e in iterations} == {0, 1}
    assert {e.rank for e in collectives} == {0, 1}
    assert all(e.job == JOB for e in iterations + collectives)

    for rank in (0, 1):
        its = sorted((e for e in iterations if e.rank == rank), key=lambda e: e.iteration)
        assert [e.iteration for e in its] == list(range(ITERATIONS))          # each exactly once
        assert all(a.end_ns <= b.start_ns for a, b in zip(its, its[1:], strict=False))

        # comm-hook events: one per bucket, all inside an iteration, summing to the model's bytes
        hook = sorted((e for e in collectives if e.rank == rank and e.communicator == "default"),
                      key=lambda e: e.seq)
        assert hook and all(e.op == "allreduce" for e in hook)
        assert [e.seq for e in hook] == list(range(len(hook)))                 # strictly increasing, no gaps
        assert all(a.start_ns <= b.start_ns for a, b in zip(hook, hook[1:], strict=False))
        per_iteration: dict[int, list[CollectiveEvent]] = defaultdict(list)
        for e in hook:
            inside = [it.iteration for it in its if it.start_ns <= e.start_ns <= e.end_ns <= it.end_ns]
            assert len(inside) == 1, f"bucket seq {e.seq} is not inside exactly one iteration: {inside}"
            per_iteration[inside[0]].append(e)
        assert sorted(per_iteration) == list(range(ITERATIONS))
        for it, buckets in per_iteration.items():
            assert sum(e.bytes for e in buckets) == PARAM_BYTES, f"rank {rank} iteration {it}"
        assert [e.collectives for e in its] == [len(per_iteration[e.iteration]) for e in its]
        assert {e.source for e in hook} == {"hook"}
        # DDP starts with one bucket and rebuilds them by bucket_cap_mb after the first iteration
        assert all(len(per_iteration[it]) >= 2 for it in range(1, ITERATIONS))

    # flight-recorder events: every collective of both DDP models, same seq ids and sizes on both ranks
    fr = {rank: sorted((e for e in collectives if e.rank == rank and e.communicator == "fr:default"),
                       key=lambda e: e.seq) for rank in (0, 1)}
    for rank, events in fr.items():
        assert events, f"no flight-recorder events from rank {rank}"
        assert [e.seq for e in events] == list(range(1, len(events) + 1))     # collective_seq_id from 1
        ops = Counter(e.op for e in events)
        assert {"allreduce", "broadcast"} <= set(ops)
        assert all(e.end_ns == e.start_ns for e in events)                    # gloo: no durations
        hook_bytes = Counter(e.bytes for e in collectives if e.rank == rank and e.communicator == "default")
        fr_allreduce_bytes = Counter(e.bytes for e in events if e.op == "allreduce")
        assert not hook_bytes - fr_allreduce_bytes, "a bucket all-reduce is missing from the flight recorder"
        assert ops["allreduce"] == 2 * sum(hook_bytes.values())               # the plain model's buckets too
    assert [(e.seq, e.op, e.bytes) for e in fr[0]] == [(e.seq, e.op, e.bytes) for e in fr[1]]
    assert {e.source for e in fr[0] + fr[1]} == {"flight_recorder"}

    # the stream's breakdown: one per iteration, the last included, each all-reduce counted once
    for order in (iterations + collectives, collectives + iterations):
        runner = ProcessorRunner(IterationBreakdownJoin())
        out = [b for i in range(0, len(order), 16) for b in runner.run(0, order[i:i + 16])]   # codec between
        for rank in (0, 1):
            mine = sorted((b for b in out if b.rank == rank), key=lambda b: b.iteration)
            assert [b.iteration for b in mine] == list(range(ITERATIONS)), f"rank {rank}"
            assert all(b.comm_bytes == PARAM_BYTES and b.comm_ns > 0 for b in mine), f"rank {rank}"
    assert time.monotonic() - t0 < 90


@needs_torch
def test_flight_recorder_off_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    from clocktower.producers.pytorch import Telemetry

    monkeypatch.delenv("TORCH_FR_BUFFER_SIZE", raising=False)
    monkeypatch.delenv("TORCH_NCCL_TRACE_BUFFER_SIZE", raising=False)
    pub = _ListPublisher()
    tele = Telemetry(job="j", node="n1", rank=3, publisher=pub, interval_s=60)
    assert tele.flight_recorder_status.startswith("disabled")
    with pytest.warns(RuntimeWarning, match="flight recorder is off"):
        summary = tele.dump_flight_recorder()
    assert summary.emitted == 0 and summary.status.startswith("disabled")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tele.dump_flight_recorder()                                           # warns once only
    tele.step()
    tele.step()
    assert tele.close() == 0
    assert [(e.rank, e.iteration, e.node) for e in pub.events] == [(3, 0, "n1"), (3, 1, "n1")]


@needs_torch
def test_telemetry_without_bootstrap_says_what_to_set(monkeypatch: pytest.MonkeyPatch) -> None:
    from clocktower.producers.pytorch import Telemetry

    monkeypatch.delenv("CLOCKTOWER_KAFKA_BOOTSTRAP", raising=False)
    with pytest.raises(ValueError, match="CLOCKTOWER_KAFKA_BOOTSTRAP"):
        Telemetry(job="j")


# --- pure parts, no torch needed -------------------------------------------------------------------
class _ListPublisher:
    def __init__(self) -> None:
        self.events: list = []
        self.calls = 0

    def publish(self, events: list) -> int:
        self.calls += 1
        self.events.extend(events)
        return 1

    def flush(self, timeout: float = 30.0) -> int:
        return 0


def _entry(seq: int, name: str = "gloo:all_reduce", sizes=((4680,),), dtypes=("Float",), retired=True,  # noqa: ANN001
           pg: str = "0", **extra) -> dict:  # noqa: ANN003
    # the shape of an entry as torch 2.13 dumps it under gloo
    return {"collective_seq_id": seq, "p2p_seq_id": 0, "is_p2p": False, "record_id": seq - 1,
            "process_group": [pg, "default_pg"], "profiling_name": name, "input_sizes": [list(s) for s in sizes],
            "input_dtypes": list(dtypes), "retired": retired, "state": "scheduled",
            "time_created_ns": 1_700_000_000_000_000_000 + seq, "time_discovered_started_ns": 0,
            "time_discovered_completed_ns": 0, **extra}


def test_flight_recorder_op_mapping_and_bytes() -> None:
    assert map_op("gloo:all_reduce") == "allreduce"
    assert map_op("nccl:allreduce_coalesced") == "allreduce"
    assert map_op("nccl:_allgather_base") == "allgather"
    assert map_op("nccl:_reduce_scatter_base") == "reducescatter"
    assert map_op("gloo:all_to_all") == "alltoall"
    assert map_op("nccl:recv 0<-1") == "recv"
    assert map_op("gloo:barrier") == "barrier"
    assert map_op("gloo:reduce") is None and map_op("gloo:gather") is None and map_op("nccl:coalesced") is None
    assert entry_bytes(_entry(1, sizes=((2, 3), (4,)), dtypes=("BFloat16", "Long"))) == 2 * 3 * 2 + 4 * 8
    assert entry_bytes(_entry(1, name="gloo:barrier", sizes=(), dtypes=())) == 0
    assert buffer_size_from_env({"TORCH_FR_BUFFER_SIZE": "2000"}) == 2000
    assert buffer_size_from_env({}) == 0


def test_flight_recorder_reader_emits_each_entry_once() -> None:
    r = FlightRecorderReader(world_group_name="0")
    dump = {"entries": [_entry(1, "gloo:broadcast"), _entry(2), _entry(3, "gloo:reduce"),
                        _entry(4, retired=False), _entry(5)]}
    events, s = r.read(dump)
    assert [(e["seq"], e["op"], e["communicator"], e["bytes"]) for e in events] == [
        (1, "broadcast", "fr:default", 4680 * 4), (2, "allreduce", "fr:default", 4680 * 4)]
    assert events[0]["start_ns"] == events[0]["end_ns"] == 1_700_000_000_000_000_001
    assert s.skipped_ops == Counter({"gloo:reduce": 1}) and s.pending == 2 and s.entries == 5
    events, s = r.read(dump)                                                  # nothing new is finished
    assert events == [] and s.pending == 2
    dump["entries"][3]["retired"] = True
    dump["entries"].append(_entry(6, "nccl:all_gather", time_discovered_started_ns=1_700_000_000_000_000_100,
                                  duration_ms=0.5, retired=False))
    dump["entries"].append(_entry(2, pg="7", sizes=((10,),), is_p2p=True, p2p_seq_id=1, name="gloo:send"))
    events, s = r.read(dump, include_pending=True)
    assert [(e["communicator"], e["seq"], e["op"]) for e in events] == [
        ("fr:default", 4, "allreduce"), ("fr:default", 5, "allreduce"), ("fr:default", 6, "allgather"),
        ("fr:7:p2p", 1, "send")]
    assert events[2]["end_ns"] - events[2]["start_ns"] == 500_000
    # the ring buffer wrapped: seq 7..9 were never seen
    events, s = r.read({"entries": [_entry(10)]})
    assert [e["seq"] for e in events] == [10] and s.missed == 3 and r.missed == 3


def test_event_buffer_batches_off_the_calling_thread() -> None:
    pub = _ListPublisher()
    buf = EventBuffer(pub, interval_s=60, batch_size=10)
    fields = {"node": "n", "ts_ns": time.time_ns(), "job": "j", "rank": 0, "start_ns": 1_700_000_000_000_000_000,
              "end_ns": 1_700_000_000_000_000_001}
    for i in range(25):
        buf.add(IterationEvent, {**fields, "iteration": i})
    buf.add(IterationEvent, {**fields, "iteration": 99, "end_ns": 1})          # invalid: dropped, counted
    deadline = time.monotonic() + 5
    while len(pub.events) < 20 and time.monotonic() < deadline:              # the thread woke at 10 pending
        time.sleep(0.01)
    assert len(pub.events) >= 20
    assert buf.close() == 0
    assert [e.iteration for e in pub.events] == list(range(25)) and buf.invalid == 1
    assert all(isinstance(e, IterationEvent) for e in pub.events)


def test_iteration_clock_context_and_steps() -> None:
    seen: list[tuple[int, int, int]] = []
    clock = IterationClock(lambda *a: seen.append(a), start=5)
    with clock.iteration() as it:
        assert it == 5
    with pytest.raises(KeyError), clock.iteration():
        raise KeyError("a failed iteration is not recorded")
    clock.step()
    clock.step()
    clock.finish()
    clock.finish()
    assert [s[0] for s in seen] == [5, 7, 8]
    assert all(start <= end for _, start, end, _ in seen)
    assert {s[3] for s in seen} == {None}                 # no comm hook to count


def test_iteration_clock_counts_the_collectives_launched_in_each_iteration() -> None:
    from clocktower.producers.pytorch.comm_hook import SequenceCounter

    seen: list[tuple[int, int, int, int | None]] = []
    seq = SequenceCounter()
    clock = IterationClock(lambda *a: seen.append(a), launched=lambda: seq.issued)
    seq.next()                                            # outside any iteration: not counted
    with clock.iteration():
        seq.next()
        seq.next()
    clock.step()
    clock.step()
    seq.next()
    clock.finish()
    assert [(s[0], s[3]) for s in seen] == [(0, 2), (1, 0), (2, 1)]


@needs_torch
def test_a_taken_spool_falls_back_to_one_of_this_process(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    """Two Telemetry publishers for the same job, node and rank never stop training: the second gets its own."""
    from clocktower.ports import free_port
    from clocktower.producers.pytorch.telemetry import default_publisher, default_spool_dir

    monkeypatch.setenv("CLOCKTOWER_KAFKA_BOOTSTRAP", f"127.0.0.1:{free_port()}")
    monkeypatch.setenv("CLOCKTOWER_SPOOL_DIR", str(tmp_path / "spool"))
    monkeypatch.setenv("RANK", "3")
    assert default_spool_dir("job/1", "n1") == tmp_path / "spool" / "job_1-n1-rank3"
    first = default_publisher("job/1", "n1")
    second = default_publisher("job/1", "n1")
    try:
        assert first.spool.dir == tmp_path / "spool" / "job_1-n1-rank3"
        assert second.spool.dir != first.spool.dir and second.spool.dir.parent == first.spool.dir.parent
    finally:
        first.close(timeout=0)
        second.close(timeout=0)
