"""The running services: embedded (or external) broker and ClickHouse, the sink and the streams.

`Stack` starts them in dependency order, checks each is ready, restarts a
crashed sink or stream worker (both resume from committed state), and stops
them in reverse order.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import sys
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from clocktower.child_process import ChildProcess, stop_all
from clocktower.config import Settings
from clocktower.data_dir import DataDirLock, checked_data_dir, private_subdirs
from clocktower.generated_secrets import ensure_producer_key, ensure_secrets
from clocktower.log_trim import LogTrimmer
from clocktower.ports import ensure_free, wait_open
from clocktower.runtime.credentials import DASHBOARDS_USER, control_key_path, credentials_path
from clocktower.runtime.errors import UserError
from clocktower.runtime.owner_note import write_owner
from clocktower.schemas.record_mac import NodeSigning
from clocktower.shutdown_signals import ignoring_stop_signals
from clocktower.stream_state import reset_stream_state
from clocktower.topic_admin import ensure_topics


def noida_binary(configured: Path | None = None) -> str:
    """The noida-db executable: CLOCKTOWER_NOIDA_BIN, else the binary inside the noida_db package, else PATH.

    The package's binary is preferred to its `noida-db` console script: that script runs the binary
    with subprocess.call, which SIGKILLs the broker 0.25 s after a SIGINT, losing its newest records.
    """
    if configured is not None:
        if not (configured.is_file() and os.access(configured, os.X_OK)):
            raise UserError(f"CLOCKTOWER_NOIDA_BIN={configured} is not an executable file: fix it, or unset it "
                            "to use the installed noida-db")
        return str(configured)
    spec = importlib.util.find_spec("noida_db")
    if spec is not None and spec.origin:
        packaged = Path(spec.origin).with_name("noida-db")
        if packaged.is_file() and os.access(packaged, os.X_OK):
            return str(packaged)
    local = Path(sys.executable).with_name("noida-db")
    found = str(local) if local.exists() else shutil.which("noida-db")
    if not found:
        raise UserError("noida-db (the embedded Kafka broker) is not installed: run `make demo`, "
                        "or `pip install noida-db`, or set CLOCKTOWER_KAFKA_BOOTSTRAP to an external broker")
    return found


def _ping(url: str) -> bool:
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/ping", timeout=1) as r:
            return r.status == 200
    except OSError:
        return False


WORKERS = {"sink": "clocktower.sinks.clickhouse", "streams": "clocktower.streams"}   # name -> module it runs
SERVICES = ("broker", "clickhouse")


class Stack:
    def __init__(self, settings: Settings, with_streams: bool = True, with_sink: bool = True,
                 fresh_stream_state: bool = False, extra_env: Mapping[str, str] | None = None,
                 sign_records: bool = False) -> None:
        """`sign_records` (`up`, `demo`): with the embedded broker and no producer key configured, one is made in the
        data dir and named to the workers, so the streams act only on records their node signed."""
        self.s = settings
        self.sign_records = sign_records
        self.producer_key: bytes | None = None   # what the stack's streams check records with (None: nothing)
        self.fresh_stream_state = fresh_stream_state   # the demo: a new simulated fleet on every run
        self.data_dir = checked_data_dir(settings.data_dir)   # a symlink is refused, not followed
        self.logs = self.data_dir / "logs"
        self.lock = DataDirLock(self.data_dir)
        self.with_streams = with_streams
        self.with_sink = with_sink
        self.children: dict[str, ChildProcess] = {}
        self.trimmer: LogTrimmer | None = None   # the embedded broker's consumed records go (clocktower/log_trim.py)
        self.services_up = False          # set once the broker, engine and topics are up and the owner note written
        self.env = {
            "CLOCKTOWER_KAFKA_BOOTSTRAP": settings.bootstrap,
            "CLOCKTOWER_CLICKHOUSE_URL": settings.clickhouse,
            "CLOCKTOWER_DATA_DIR": str(self.data_dir),
            "PYTHONUNBUFFERED": "1",
            **(extra_env or {}),      # e.g. the demo's spare pool for the streams
        }
        if settings.embedded_kafka:   # the workers make up for the embedded broker (runtime/broker_profile.py)
            self.env["CLOCKTOWER_BROKER_PROFILE"] = "embedded"
        if settings.embedded_kafka and settings.control_private_key_file is None:
            # the children see an "external" bootstrap (ours): name the data dir's generated key for them
            self.env["CLOCKTOWER_CONTROL_PRIVATE_KEY_FILE"] = str(control_key_path(self.data_dir))

    # --- start ------------------------------------------------------------------
    def start(self, on_step=lambda msg: None) -> None:  # noqa: ANN001
        self.lock.acquire()
        try:
            self._start(on_step)
        except BaseException:
            self.stop()
            raise

    def _start(self, on_step) -> None:  # noqa: ANN001
        s = self.s
        private_subdirs(self.data_dir)   # 0700, and none a symlink or another user's
        ensure_secrets(self.data_dir, clickhouse_users=s.embedded_clickhouse)  # first start only; kept after
        self.producer_key = self._producer_key()
        if s.embedded_kafka:
            ensure_free(s.host, s.kafka_port, "the embedded Kafka broker", "--kafka-port")
        if s.embedded_clickhouse:
            ensure_free(s.host, s.http_port, "the embedded ClickHouse endpoint", "--http-port")
        if s.embedded_kafka:
            on_step(f"starting the embedded Kafka broker on {s.bootstrap}")
            kafka_dir = self.data_dir / "kafka"
            self._spawn("broker", [noida_binary(s.noida_bin), "start", "--only", "kafka", "--host", s.host,
                                   "--kafka-port", str(s.kafka_port), "--data-dir", str(kafka_dir)],
                        stop_signal=signal.SIGINT)
            self._wait(lambda: wait_open(s.host, s.kafka_port, 0.2), "broker", 30)
        if s.embedded_clickhouse:
            on_step(f"starting the embedded ClickHouse engine, HTTP on {s.clickhouse}; logins in "
                    f"{credentials_path(self.data_dir)} (user {DASHBOARDS_USER!r} is read-only, for Grafana)")
            self._spawn("clickhouse", [sys.executable, "-m", "clocktower.sinks.endpoint", "--data-dir",
                                       str(self.data_dir / "clickhouse"), "--host", s.host,
                                       "--port", str(s.http_port), "--max-connections", str(s.http_max_connections),
                                       "--credentials", str(credentials_path(self.data_dir))])
            self._wait(lambda: _ping(s.clickhouse), "clickhouse", 60)
        if self.fresh_stream_state and s.embedded_kafka:
            reset_stream_state(s.bootstrap, self.data_dir)
        on_step("creating topics")
        ensure_topics(s.bootstrap, disable_auto_create=s.embedded_kafka)   # a typo'd topic fails, not auto-created
        write_owner(self.data_dir, {"kafka": s.bootstrap, "clickhouse": s.clickhouse,
                                    "clickhouse_embedded": s.embedded_clickhouse})
        self.services_up = True
        if s.embedded_kafka and s.log_trim_s > 0:
            self.trimmer = LogTrimmer(s.bootstrap, s.log_trim_s, s.log_keep_s)
            self.trimmer.start()
        if self.with_sink:
            on_step("starting the ClickHouse sink")
            self.start_worker("sink")
        if self.with_streams:
            n = s.streams_workers
            on_step("starting the Faust stream processors" + (f" ({n} workers)" if n > 1 else ""))
            for i in range(1, n + 1):
                self.start_worker("streams", i)

    def _producer_key(self) -> bytes | None:
        """The producer key of this process's settings (the workers inherit them), else with `sign_records` and the
        embedded broker the data dir's, made on first start and named to the workers (CLOCKTOWER_PRODUCER_KEY_FILE)."""
        configured = NodeSigning().producer_key_bytes()   # unfit: a ValidationError, one line from the CLI
        if configured is not None or not (self.sign_records and self.s.embedded_kafka):
            return configured
        path = ensure_producer_key(self.data_dir)
        self.env["CLOCKTOWER_PRODUCER_KEY_FILE"] = str(path)
        return NodeSigning(producer_key_file=path).producer_key_bytes()

    def start_worker(self, name: str, index: int = 1) -> str:
        """Start one worker ("sink" or "streams") of a started stack, e.g. one left out by with_sink=False;
        `index` > 1 starts another streams worker, with its own member id. Returns its child name."""
        if name not in WORKERS:
            raise ValueError(f"unknown worker {name!r}: one of {sorted(WORKERS)}")
        if index != 1 and name != "streams":
            raise ValueError(f"only the streams run several workers, not the {name}")
        child = name if index == 1 else f"{name}-{index}"
        if not self.services_up:
            raise UserError(f"cannot start the {name}: the stack's services are not started (call start() first)")
        running = self.children.get(child)
        if running is not None and running.alive():
            raise UserError(f"the {child} is already running (pid {running.pid})")
        env = {}
        if name == "streams":
            (self.data_dir / "streams").mkdir(parents=True, exist_ok=True)
            if index > 1:
                base = self.s.streams_instance_id or f"clocktower-streams-{socket.gethostname()}"
                env["CLOCKTOWER_STREAMS_INSTANCE_ID"] = f"{base}-{index}"
                if self.s.streams_metrics_port:   # each worker its own port: base, base + 1, ...
                    env["CLOCKTOWER_STREAMS_METRICS_PORT"] = str(self.s.streams_metrics_port + index - 1)
        self._spawn(child, [sys.executable, "-m", WORKERS[name]], env=env)
        return child

    def _spawn(self, name: str, argv: list[str], stop_signal: int = signal.SIGTERM,
               env: dict[str, str] | None = None) -> None:
        child = ChildProcess(name, argv, self.logs / f"{name}.log", {**self.env, **(env or {})}, stop_signal)
        self.children[name] = child
        try:
            child.start()
        except OSError as exc:
            raise UserError(f"cannot start the {name} process ({argv[0]}): {exc.strerror or exc}") from None

    def _wait(self, ready, name: str, timeout: float) -> None:  # noqa: ANN001
        child = self.children[name]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():
                return
            if not child.alive():
                last = child.log_tail(1).strip() or f"exit code {child.exit_code()}"
                raise UserError(f"{name} failed to start: {last} (log: {child.log_path})")
            time.sleep(0.1)
        raise UserError(f"{name} did not become ready within {timeout:.0f} s (log: {child.log_path})")

    # --- run --------------------------------------------------------------------
    def supervise(self) -> list[str]:
        """Restart crashed workers; raise if an embedded service died. Returns what was restarted."""
        restarted = []
        for name in SERVICES:
            child = self.children.get(name)
            if child is not None and not child.alive():
                raise UserError(f"the {name} process exited ({child.exit_code()}): {child.log_tail(1)} "
                                f"(log: {child.log_path})")
        for name, child in list(self.children.items()):
            if name not in SERVICES and child.restart_if_dead():
                restarted.append(name)
        return restarted

    def stop(self, timeout: float = 30.0) -> None:
        """Stop everything within about `timeout` s, then release the data dir whatever happened.

        Two waves, each stopped together: the workers first (the sink's last insert and commit still
        reach ClickHouse and the broker), then the services; what is left at a wave's deadline is killed."""
        deadline = time.monotonic() + timeout
        self.services_up = False
        if self.trimmer is not None:
            self.trimmer.stop(timeout=2.0)   # a pass under way ends on its own (a daemon thread)
        try:
            with ignoring_stop_signals():
                workers = [c for n, c in self.children.items() if n not in SERVICES]
                stop_all(workers, (deadline - time.monotonic()) * 2 / 3)
                services = [self.children[n] for n in ("clickhouse", "broker") if n in self.children]
                stop_all(services, max(5.0, deadline - time.monotonic()))
        finally:
            self.lock.release()
