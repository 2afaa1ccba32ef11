"""Shared fixtures: a real pipeline (embedded broker, ClickHouse endpoint, sink, streams) on free ports."""

from __future__ import annotations

import signal
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
from clickhouse_connect.driver.client import Client
from pyroute2 import config as pyroute2_config

from clocktower.config import Settings
from clocktower.ports import free_port
from clocktower.runtime.clickhouse_client import http_client
from clocktower.shutdown_signals import STOP_SIGNALS
from clocktower.stack import Stack
from tests.simulated_fleet import SimulatedFleet, load

# pyroute2 forks helpers (netns.create, sockets in a namespace) and stops them with SIGTERM. A forked helper keeps
# the parent's Python handlers, and a test that ran the CLI in-process leaves SIGTERM raising KeyboardInterrupt
# (clocktower/shutdown_signals.py): the helper then unwound into pytest's own loop instead of exiting, and a
# second copy of the test session ran on (seen in a fresh-clone CI run). Helpers reset SIGINT/SIGTERM instead.
pyroute2_config.disable_mp_signal = True


@pytest.fixture(autouse=True)
def _signal_handlers_restored() -> Iterator[None]:
    """A test that runs `clocktower demo`/`up` in-process installs stop handlers: put the previous ones back."""
    before = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    yield
    for sig, handler in before.items():
        signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


@dataclass
class Pipeline:
    settings: Settings
    stack: Stack
    client: Client


def start_pipeline(data_dir: Path, with_streams: bool = True, with_sink: bool = True,
                   worker_env: Mapping[str, str] | None = None, **settings: object) -> Pipeline:
    """`settings` configure this process's view; `worker_env` (CLOCKTOWER_* variables) its worker processes.
    The embedded broker's consumed records are kept (log_trim_s 0) unless a test asks: tests and the failover
    benchmark read topics from their start after the pipeline did."""
    settings = {"log_trim_s": 0.0, **settings}
    settings = Settings(data_dir=data_dir, kafka_port=free_port(), http_port=free_port(),
                        kafka_bootstrap=None, clickhouse_url=None, flush_interval_s=0.5, **settings)
    stack = Stack(settings, with_streams=with_streams, with_sink=with_sink, extra_env=worker_env)
    stack.start()
    client = http_client(settings.clickhouse, *settings.clickhouse_login())
    return Pipeline(settings, stack, client)


@pytest.fixture
def pipeline(tmp_path: Path) -> Iterator[Pipeline]:
    p = start_pipeline(tmp_path / "ct")
    try:
        yield p
    finally:
        p.stack.stop()


@pytest.fixture
def pipeline_without_streams(tmp_path: Path) -> Iterator[Pipeline]:
    p = start_pipeline(tmp_path / "ct", with_streams=False)
    try:
        yield p
    finally:
        p.stack.stop()


def start_services(data_dir: Path) -> Pipeline:
    """Only the embedded broker and ClickHouse endpoint, for tests that run their own sink."""
    return start_pipeline(data_dir, with_streams=False, with_sink=False)


@pytest.fixture
def services(tmp_path: Path) -> Iterator[Pipeline]:
    p = start_services(tmp_path / "ct")
    try:
        yield p
    finally:
        p.stack.stop()


@pytest.fixture(scope="session")
def simulated_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimulatedFleet]:
    """The engine holding a simulated fleet run (tests/simulated_fleet.py), for the tests that only read it."""
    tmp = tmp_path_factory.mktemp("simulated-fleet")
    services = start_services(tmp / "ct")
    try:
        yield load(services.client, services.settings, tmp / "actuators")
    finally:
        services.stack.stop()
