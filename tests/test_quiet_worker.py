"""The streams' Faust worker leaves the root logger at the asked level (issue 19: Faust's spinner set it to
DEBUG, and every debug call in Faust and aiokafka built a log record: 5.6 % of a worker's samples)."""

from __future__ import annotations

import io
import logging

import faust
import pytest

from clocktower.streams.engine.quiet_worker import QuietWorker


@pytest.fixture
def root_logging():
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield root
    root.setLevel(level)
    root.handlers[:] = handlers


@pytest.mark.parametrize("worker_class, debug_enabled", [(faust.Worker, True), (QuietWorker, False)])
def test_a_warn_level_worker_does_not_enable_debug_logging(root_logging, worker_class, debug_enabled) -> None:
    app = faust.App("quiet-worker-test", broker="memory://", web_enabled=False)
    worker = worker_class(app, loglevel="warn", stdout=io.StringIO(), stderr=io.StringIO(), redirect_stdouts=False)
    worker._setup_logging()
    assert logging.getLogger("aiokafka.producer.producer").isEnabledFor(logging.DEBUG) is debug_enabled
    assert logging.getLogger("faust").isEnabledFor(logging.WARNING)
