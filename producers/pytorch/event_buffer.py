"""Hands events to the publisher in batches from a background thread, off the training hot path.

The hot path (comm-hook callbacks, iteration boundaries) only appends a tuple of plain fields to a
deque. The thread wakes every `interval_s`, or as soon as `batch_size` events are pending, builds the
pydantic events and calls `publisher.publish(batch)`. A publisher failure is logged and counted, never
raised into the training loop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from clocktower.schemas.event import Event

log = logging.getLogger(__name__)


class Publisher(Protocol):
    """What the buffer needs: KafkaPublisher and the spooling publisher both fit."""

    def publish(self, events: list[Event]) -> Any: ...

    def flush(self, timeout: float = ...) -> Any: ...


class OnFirstUse:
    """A publisher made when first needed: Telemetry's default spool is named by the rank, which
    torch.distributed knows only once the process group is up (e.g. under torch.multiprocessing.spawn)."""

    def __init__(self, make: Callable[[], Publisher]) -> None:
        self._make = make
        self._lock = threading.Lock()
        self.target: Publisher | None = None

    def get(self) -> Publisher:
        with self._lock:
            if self.target is None:
                self.target = self._make()
            return self.target

    def publish(self, events: list[Event]) -> Any:
        return self.get().publish(events)

    def flush(self, timeout: float = 30.0) -> Any:
        return 0 if self.target is None else self.target.flush(timeout)


class EventBuffer:
    def __init__(self, publisher: Publisher, interval_s: float = 1.0, batch_size: int = 1000,
                 max_pending: int = 1_000_000) -> None:
        self.publisher = publisher
        self.interval_s = interval_s
        self.batch_size = batch_size
        self.max_pending = max_pending
        self.published = 0          # events handed to publisher.publish
        self.dropped = 0            # events dropped because max_pending was reached
        self.invalid = 0            # events that failed schema validation
        self.publish_errors = 0     # publish() calls that raised
        self._pending: deque[tuple[type[Event], dict[str, Any]]] = deque()
        self._wake = threading.Event()
        self._stop = False
        self._lock = threading.Lock()   # one drain at a time
        self._thread = threading.Thread(target=self._run, name="clocktower-telemetry", daemon=True)
        self._thread.start()

    def add(self, model: type[Event], fields: dict[str, Any]) -> None:
        """Queue one event (as plain fields; it is validated on the background thread). Never blocks."""
        if len(self._pending) >= self.max_pending:
            self.dropped += 1
            return
        self._pending.append((model, fields))
        if len(self._pending) >= self.batch_size:
            self._wake.set()

    def _run(self) -> None:
        while not self._stop:
            self._wake.wait(self.interval_s)
            self._wake.clear()
            self.drain()

    def drain(self) -> int:
        """Publish everything pending now; returns the events published."""
        with self._lock:
            n = 0
            while self._pending:
                batch: list[Event] = []
                while self._pending and len(batch) < self.batch_size:
                    model, fields = self._pending.popleft()
                    try:
                        batch.append(model(**fields))
                    except ValueError as exc:   # pydantic's ValidationError is a ValueError
                        self.invalid += 1
                        log.warning("dropping an invalid %s event: %s", model.SCHEMA, exc)
                if not batch:
                    continue
                try:
                    self.publisher.publish(batch)
                    self.published += len(batch)
                    n += len(batch)
                except Exception:  # noqa: BLE001 - telemetry must never stop training
                    self.publish_errors += 1
                    log.exception("publishing %d telemetry events failed; they are dropped", len(batch))
            return n

    def close(self, timeout: float = 30.0) -> int:
        """Stop the thread, publish what is left, flush the publisher; returns deliveries still pending."""
        self._stop = True
        self._wake.set()
        self._thread.join(timeout)
        self.drain()
        deadline = time.monotonic() + timeout
        try:
            left = self.publisher.flush(max(0.0, deadline - time.monotonic()))
        except Exception:  # noqa: BLE001
            log.exception("flushing the telemetry publisher failed")
            return -1
        return int(left or 0)
