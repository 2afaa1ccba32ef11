"""Shared fixtures: a real pipeline (embedded broker, ClickHouse endpoint, sink, streams) on free ports."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from clickhouse_connect.driver.client import Client

from clocktower.config import Settings
from clocktower.ports import free_port
from clocktower.runtime.clickhouse_client import http_client
from clocktower.stack import Stack


@dataclass
class Pipeline:
    settings: Settings
    stack: Stack
    client: Client


def start_pipeline(data_dir: Path, with_streams: bool = True, with_sink: bool = True, **settings: object) -> Pipeline:
    settings = Settings(data_dir=data_dir, kafka_port=free_port(), http_port=free_port(),
                        kafka_bootstrap=None, clickhouse_url=None, flush_interval_s=0.5, **settings)
    stack = Stack(settings, with_streams=with_streams, with_sink=with_sink)
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
