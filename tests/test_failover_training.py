"""The real workload through a failover: a 2-rank gloo DDP training job across the two hosts of the failover
bed (tests/failover_bed.py), one rank per host (network namespace), trains through three flaps of the
primary and a 20 s hard down, and must finish with no collective error, no restart, and parameters
bit-identical to an undisturbed run of the same seed and step count.

Each rank is a process that enters its host's namespace before importing torch (`python -m
tests.test_failover_training worker ...`); the rendezvous (TCPStore) and gloo's connections run between the
hosts' service addresses, which an interface `svc` carries (GLOO_SOCKET_IFNAME binds to an interface's
first address; lo's is 127.0.0.1), routed via the primary.

Two variants. In the first each host runs the bed's link agent process (HostAgent: a real LinkSource ->
LinkWatchdog (T_watchdog 50 ms) -> KernelRouting), which moves the routes to the backup when the primary
loses carrier, and the test restores once the primary has been up for a second (standing in for the
pipeline). The second (e2e) runs everything real, as tests/test_failover_e2e.py does: per host `clocktower
agent --actuate` (CLOCKTOWER_AGENT_NETNS), the broker, the stream workers (which order each restore after
T_stable, 3 s here) and the sink, and checks that every command was acked `applied`.

The disturbed run trains until the test says stop (rank 0 reads a stop file and all-reduces the flag each
step, so both ranks stop at the same step), pacing its steps so the training spans the disturbances; the
undisturbed run then trains the same number of steps, unpaced, on the same bed with no disturbance.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from clickhouse_connect.driver.exceptions import DatabaseError

from tests.failover_bed import BACKUP, HOSTS, PRIMARY, REPO, SERVICE, FailoverBed, failover_bed

if TYPE_CHECKING:
    from tests.conftest import Pipeline

SEED = 1234
PORT = 29517
PACE_S = 0.02           # the disturbed run's pause between steps: ~40 s of training, a few thousand steps
HARD_DOWN_S = 20.0
FLAPS = 3
RUN_TIMEOUT_S = 150.0
STABLE_S = 3.0          # the pipeline's T_stable in the full variant (CLOCKTOWER_STREAMS_LINK_STABLE_S)


def _worker(rank: int, ns: str, steps: int, stop_file: str, out_file: str, pace_s: float) -> None:
    """One rank: enter the namespace, then import torch and train (see the module doc); results as JSON."""
    from pyroute2 import netns

    netns.setns(ns, flags=0)          # before torch: its threads and sockets all live in the host's namespace
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    dist.init_process_group("gloo", init_method=f"tcp://{SERVICE['a']}:{PORT}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=60))
    torch.manual_seed(SEED)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                                torch.nn.ReLU(), torch.nn.Linear(256, 10))
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    data = torch.Generator().manual_seed(SEED * 10 + rank)
    progress = Path(out_file).with_suffix(".progress")
    staged = progress.with_suffix(".progress-staged")
    step, max_step_s, errors = 0, 0.0, []
    try:
        while True:
            started = time.monotonic()
            x = torch.randn(32, 64, generator=data)
            y = torch.randint(0, 10, (32,), generator=data)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(ddp(x), y).backward()
            opt.step()
            step += 1
            if steps:
                done = step >= steps
            else:
                flag = torch.tensor([1.0 if rank == 0 and os.path.exists(stop_file) else 0.0])
                dist.all_reduce(flag)
                done = bool(flag.item() > 0)
            max_step_s = max(max_step_s, time.monotonic() - started)
            if step % 25 == 0:         # replaced whole: a reader never sees the truncated file of write_text
                staged.write_text(str(step))
                staged.replace(progress)
            if done:
                break
            if pace_s:
                time.sleep(pace_s)
    except Exception as e:  # noqa: BLE001 - reported to the test, which fails on it
        errors.append(f"{type(e).__name__}: {e}")
    if not errors:
        try:
            dist.barrier()                # both ranks are done with every collective before either leaves
        except Exception as e:  # noqa: BLE001 - reported to the test
            errors.append(f"barrier: {type(e).__name__}: {e}")
    params = b"".join(p.detach().numpy().tobytes() for p in model.parameters())
    Path(out_file).write_text(json.dumps({
        "rank": rank, "pid": os.getpid(), "steps": step, "errors": errors, "max_step_ms": max_step_s * 1e3,
        "digest": hashlib.sha256(params).hexdigest()}))
    # no destroy_process_group: gloo's teardown could hang the exit once the peer is gone; the result is written
    sys.stdout.flush()
    os._exit(0)


class Job:
    """The two ranks as subprocesses; `results()` waits for both and reads their JSON."""

    def __init__(self, bed: FailoverBed, work: Path, name: str, steps: int = 0, pace_s: float = 0.0) -> None:
        work.mkdir(parents=True, exist_ok=True)
        self.stop_file = work / f"{name}.stop"
        self.outs = [work / f"{name}-rank{rank}.json" for rank in (0, 1)]
        env = {**os.environ, "GLOO_SOCKET_IFNAME": "svc", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        self.logs = [open(work / f"{name}-rank{rank}.log", "wb") for rank in (0, 1)]  # noqa: SIM115
        self.procs = [subprocess.Popen(
            [sys.executable, "-m", "tests.test_failover_training", "worker", str(rank), bed.ns[host], str(steps),
             str(self.stop_file), str(out), str(pace_s)], cwd=REPO, env=env, stdout=log, stderr=log)
            for rank, (host, out, log) in enumerate(zip(HOSTS, self.outs, self.logs, strict=True))]

    def step(self) -> int:
        try:
            text = self.outs[0].with_suffix(".progress").read_text()
        except FileNotFoundError:       # rank 0 has not reached step 25 yet
            return 0
        return int(text)                # whole: the worker replaces the file, never truncates it in place

    def wait_step(self, n: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self.step() < n:
            assert all(p.poll() is None for p in self.procs), f"a rank exited early:\n{self.log()}"
            assert time.monotonic() < deadline, f"training did not reach step {n} in {timeout_s} s:\n{self.log()}"
            time.sleep(0.1)

    def log(self) -> str:
        return "\n".join(Path(f.name).read_text(errors="replace")[-3000:] for f in self.logs)

    def results(self, timeout_s: float = RUN_TIMEOUT_S) -> list[dict]:
        deadline = time.monotonic() + timeout_s
        try:
            for p in self.procs:
                p.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pytest.fail(f"training did not finish in {timeout_s} s:\n{self.log()}")
        finally:
            self.kill()
        codes = [p.returncode for p in self.procs]
        assert codes == [0, 0], f"ranks exited with {codes}:\n{self.log()}"
        return [json.loads(out.read_text()) for out in self.outs]

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for f in self.logs:
            f.close()


def _on(bed: FailoverBed, link: str) -> bool:
    return all(bed.route_to_peer(host)[0] == link for host in HOSTS)


def _wait_on(bed: FailoverBed, link: str, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not _on(bed, link):
        assert time.monotonic() < deadline, f"routes not on {link}: {[bed.route_to_peer(h) for h in HOSTS]}"
        time.sleep(0.01)


def _disturb(bed: FailoverBed, job: Job, restored: Callable[[], None]) -> list[dict]:
    """Train through FLAPS flaps, the restore, a HARD_DOWN_S hard down and the restore (`restored` returns once
    both hosts are back on the primary); then stop the job and return its results."""
    try:
        job.wait_step(50, 90)
        for _ in range(FLAPS):
            bed.hard_down()
            time.sleep(0.3)
            assert _on(bed, BACKUP), [bed.route_to_peer(h) for h in HOSTS]
            bed.hard_up()
            for host in HOSTS:
                bed.wait_carrier(host, PRIMARY, True)
            time.sleep(0.3)
        restored()
        before = job.step()
        time.sleep(1.0)
        bed.hard_down()
        _wait_on(bed, BACKUP, 2.0)
        time.sleep(HARD_DOWN_S)
        assert job.step() > before + 50, "training stalled during the hard down"
        bed.hard_up()
        for host in HOSTS:
            bed.wait_carrier(host, PRIMARY, True)
        restored()
        job.wait_step(job.step() + 50, 30)              # trains on after the restore
        job.stop_file.touch()
        return job.results()
    finally:
        job.kill()


def _check(bed: FailoverBed, job: Job, disturbed: list[dict], work: Path) -> None:
    """No error, no restart, and the parameters of an undisturbed run of as many steps (same bed, same seed)."""
    assert [r["pid"] for r in disturbed] == [p.pid for p in job.procs], "a rank was restarted"
    steps = disturbed[0]["steps"]
    undisturbed = Job(bed, work, "quiet", steps=steps).results()
    for run in (disturbed, undisturbed):
        assert [r["errors"] for r in run] == [[], []], run
        assert run[0]["steps"] == run[1]["steps"] == steps, run
        assert run[0]["digest"] == run[1]["digest"], "ranks disagree: DDP out of sync"
    assert disturbed[0]["digest"] == undisturbed[0]["digest"], (disturbed, undisturbed)
    print(f"trained {steps} steps through {FLAPS} flaps and a {HARD_DOWN_S:.0f} s hard down; longest step "
          f"{max(r['max_step_ms'] for r in disturbed):.0f} ms (undisturbed "
          f"{max(r['max_step_ms'] for r in undisturbed):.0f} ms)")


needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                 reason="torch is not installed (make setup-pytorch)")


@needs_torch
def test_ddp_training_survives_flaps_and_a_hard_down_bit_identically(tmp_path: Path) -> None:
    """The local watchdogs fail over; the test restores 1 s after the primary is back (the pipeline's part)."""
    with failover_bed("ftrn") as bed:
        bed.add_service_device("svc")
        with bed.agents(tmp_path, delay_s=0.05) as agents:
            def restored() -> None:
                time.sleep(1.0)
                for host in HOSTS:
                    agents[host].routing.restore(PRIMARY, BACKUP)
                _wait_on(bed, PRIMARY)

            job = Job(bed, tmp_path / "runs", "disturbed", pace_s=PACE_S)
            disturbed = _disturb(bed, job, restored)
            failovers = [a for agent in agents.values() for a in agent.acks]
        assert not [a for a in failovers if a.status != "applied"], failovers
        assert len(failovers) >= 2 * (FLAPS + 1) - 2, failovers     # each host, each down episode (a blip may merge)
        _check(bed, job, disturbed, tmp_path / "runs")


@needs_torch
@pytest.mark.e2e
def test_ddp_training_survives_with_the_real_agents_and_pipeline(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The same with everything real: per host `clocktower agent --actuate` (its watchdog fails over), the broker,
    stream workers (T_stable 3 s: they order every restore) and sink; every command acked `applied`."""
    from clocktower.runtime.credentials import control_public_key_path
    from tests.conftest import start_pipeline

    monkeypatch.setenv("CLOCKTOWER_STREAMS_LINK_STABLE_S", str(STABLE_S))
    with failover_bed("ftrp") as bed:
        bed.add_service_device("svc")
        p = start_pipeline(tmp_path / "ct")
        try:
            with bed.real_agents(p.settings.bootstrap, tmp_path / "agents",
                                 control_public_key_path(p.settings.data_dir)) as agents:
                nodes = "(" + ",".join(f"'{bed.node(h)}'" for h in HOSTS) + ")"
                _rows(p, f"SELECT DISTINCT node FROM link_states WHERE node IN {nodes} AND up", 2)

                def restored() -> None:              # the pipeline's restore, T_stable after the primary is back
                    up = time.monotonic()
                    _wait_on(bed, PRIMARY, STABLE_S + 20)
                    assert time.monotonic() - up >= STABLE_S - 0.5, "restored before T_stable"

                job = Job(bed, tmp_path / "runs", "disturbed", pace_s=PACE_S)
                disturbed = _disturb(bed, job, restored)
                assert all(a.alive() for a in agents.values())
            cmds = _rows(p, f"SELECT command_id, action FROM control_commands FINAL WHERE node IN {nodes}", 8)
            assert sorted(r[1] for r in cmds) == ["failover"] * 4 + ["restore"] * 4, cmds
            acks = _rows(p, f"SELECT command_id, status FROM control_acks WHERE node IN {nodes} "
                            "AND origin = 'command'", len(cmds))
            assert {r[0] for r in cmds} <= {r[0] for r in acks if r[1] == "applied"}, (cmds, acks)
        finally:
            p.stack.stop()
        _check(bed, job, disturbed, tmp_path / "runs")


def _rows(p: Pipeline, sql: str, want: int, timeout_s: float = 60.0) -> list:
    deadline = time.monotonic() + timeout_s
    rows: list = []
    while time.monotonic() < deadline:
        with contextlib.suppress(DatabaseError):   # the sink creates its tables as it starts
            rows = p.client.query(sql).result_rows
        if len(rows) >= want:
            break
        p.stack.supervise()
        time.sleep(0.3)
    return rows


if __name__ == "__main__" and sys.argv[1:2] == ["worker"]:
    _rank, _ns, _steps, _stop, _out, _pace = sys.argv[2:8]
    _worker(int(_rank), _ns, int(_steps), _stop, _out, float(_pace))
