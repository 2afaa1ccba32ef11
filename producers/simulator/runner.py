"""Runs a FleetSimulator against a publisher, in ticks, optionally at wall-clock pace.

Each tick advances the simulator by `tick_s` and publishes what it emitted.
Each injected fault is published (to groundtruth.faults, via the same
publisher) in the tick in which it starts, and appended to
`ground_truth_path` as one JSON line at the same moment, so the file and the
topic hold exactly the faults that were injected before the run ended.
"""

from __future__ import annotations

import collections
import logging
import pathlib
import threading
import time
from collections.abc import Callable, Iterable
from typing import IO, Protocol

from clocktower.producers.simulator.fleet import FleetSimulator
from clocktower.schemas.event import Event

log = logging.getLogger(__name__)


class Publisher(Protocol):
    def publish(self, events: Iterable[Event]) -> object: ...

    def flush(self) -> object: ...


def run_simulation(sim: FleetSimulator, publisher: Publisher, duration_s: float, *, tick_s: float = 0.1,
                   realtime: bool = True, stop: threading.Event | None = None,
                   on_tick: Callable[[FleetSimulator], None] | None = None,
                   ground_truth_path: pathlib.Path | None = None) -> collections.Counter[str]:
    """Advance `sim` by `duration_s` of true time, publishing as it goes; returns events published per schema.

    With `realtime`, each tick waits until the wall clock reaches the tick's
    end (a simulator created earlier catches up at full speed first). Setting
    `stop` ends the run within one tick; the publisher is flushed either way.
    """
    if duration_s < 0:
        raise ValueError(f"duration_s must be >= 0, got {duration_s}")
    if tick_s <= 0:
        raise ValueError(f"tick_s must be > 0, got {tick_s}")
    tick_ns = max(1, round(tick_s * 1e9))
    end_ns = sim.now_ns + round(duration_s * 1e9)
    published: collections.Counter[str] = collections.Counter()
    faults = sorted(sim.faults, key=lambda f: f.start_ns)
    next_fault = 0
    truth: IO[str] | None = None
    try:
        if ground_truth_path is not None:
            ground_truth_path.parent.mkdir(parents=True, exist_ok=True)
            truth = ground_truth_path.open("w", encoding="utf-8")
        while sim.now_ns < end_ns:
            if stop is not None and stop.is_set():
                break
            target = min(sim.now_ns + tick_ns, end_ns)
            if realtime:
                delay = (target - time.time_ns()) / 1e9
                if delay > 0:
                    if stop is not None:
                        if stop.wait(delay):
                            break
                    else:
                        time.sleep(delay)
            events: list[Event] = sim.advance(target)
            started = []
            while next_fault < len(faults) and faults[next_fault].start_ns <= target:
                started.append(faults[next_fault])
                next_fault += 1
            if started:
                events.extend(started)
                if truth is not None:
                    truth.writelines(f.model_dump_json() + "\n" for f in started)
                    truth.flush()
                log.info("injected %s", ", ".join(f"{f.kind} on {f.target}" for f in started))
            if events:
                publisher.publish(events)
                for model, n in collections.Counter(map(type, events)).items():
                    published[model.SCHEMA] += n
            if on_tick is not None:
                on_tick(sim)
    finally:
        if truth is not None:
            truth.close()
        publisher.flush()
    return published
