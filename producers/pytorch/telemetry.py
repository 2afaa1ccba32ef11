"""Telemetry: one object a training script creates to publish its collectives and iterations."""

from __future__ import annotations

import atexit
import logging
import os
import socket
import time
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from clocktower.producers.pytorch._torch import require_torch
from clocktower.producers.pytorch.comm_hook import BucketTimingHook, SequenceCounter
from clocktower.producers.pytorch.event_buffer import EventBuffer, OnFirstUse, Publisher
from clocktower.producers.pytorch.flight_recorder import (
    ENV_VARS,
    FlightRecorderDump,
    FlightRecorderReader,
    buffer_size_from_env,
    dump_json,
)
from clocktower.producers.pytorch.iterations import IterationClock
from clocktower.schemas.telemetry import CollectiveEvent, IterationEvent

torch = require_torch()
dist = torch.distributed

log = logging.getLogger(__name__)

BOOTSTRAP_ENV = "CLOCKTOWER_KAFKA_BOOTSTRAP"
SPOOL_ENV = "CLOCKTOWER_SPOOL_DIR"


def known_rank() -> int | None:
    """This process's rank as far as it is known yet: torch.distributed's once the process group is up (any
    launcher, torch.multiprocessing.spawn included), else $RANK (torchrun sets it before), else None."""
    if dist.is_initialized():
        return dist.get_rank()
    env = os.environ.get("RANK", "")
    return int(env) if env.isdigit() else None


def world_size() -> int | None:
    """The job's ranks: torch.distributed's once the process group is up, else $WORLD_SIZE, else None."""
    if dist.is_initialized():
        return dist.get_world_size()
    env = os.environ.get("WORLD_SIZE", "")
    return int(env) if env.isdigit() and int(env) > 0 else None


def local_rank() -> int | None:
    """This rank's GPU on its node: $LOCAL_RANK (torchrun sets it, and by convention it is the device index), else
    the current CUDA device when CUDA is up, else None (unknown: a CPU run)."""
    env = os.environ.get("LOCAL_RANK", "")
    if env.isdigit() and int(env) < 256:
        return int(env)
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return int(torch.cuda.current_device())
    return None


def default_spool_dir(job: str, node: str, rank: int | None = None) -> Path:
    """One spool per job, node and rank (`rank`, else known_rank(), else the pid), in a per-user directory
    ($CLOCKTOWER_SPOOL_DIR, else $XDG_CACHE_HOME or ~/.cache): a rank restarted under the same job replays
    what its previous run could not deliver."""
    env = os.environ.get(SPOOL_ENV)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    root = Path(env) if env else cache / "clocktower" / "spool"
    rank = known_rank() if rank is None else rank
    who = f"rank{rank}" if rank is not None else f"pid{os.getpid()}"
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in f"{job}-{node}-{who}")
    return root / safe


def bootstrap_from_env() -> str:
    bootstrap = os.environ.get(BOOTSTRAP_ENV)
    if not bootstrap:
        raise ValueError(f"Telemetry needs a Kafka broker: set {BOOTSTRAP_ENV}=host:port, "
                         "or pass publisher= (any object with publish(events) and flush(timeout))")
    return bootstrap


def default_publisher(job: str, node: str, rank: int | None = None) -> Publisher:
    """The node agent's publisher: a SpoolingPublisher, so a broker outage mid-training loses nothing.

    If the spool is taken (the same job name twice on a node, or a second Telemetry in this process) a
    spool of this process's own is used instead, with a warning: telemetry never stops training."""
    bootstrap = bootstrap_from_env()
    from clocktower.producers.spool import SpoolInUse
    from clocktower.producers.spooling_publisher import SpoolingPublisher

    spool_dir = default_spool_dir(job, node, rank)
    try:
        return SpoolingPublisher(bootstrap, spool_dir)
    except SpoolInUse as exc:
        own = spool_dir.with_name(f"{spool_dir.name}-pid{os.getpid()}-{id(exc):x}")
        log.warning("%s; using %s", exc, own)
        return SpoolingPublisher(bootstrap, own)


def group_label(pg: Any) -> str:
    """The communicator of a comm-hook event: "default" for the world group (or None), else the group name."""
    if pg is None or not dist.is_initialized() or pg is dist.group.WORLD:
        return "default"
    return getattr(pg, "group_name", "") or "default"


class Telemetry:
    """Publishes this rank's all-reduce buckets, iterations and flight-recorder collectives.

    ```
    tele = Telemetry(job="llm-7b")            # node = hostname, rank from torch.distributed
    model = tele.instrument(DDP(model))       # times every all-reduce bucket
    for batch in loader:
        with tele.iteration():                # or tele.step() at the top of the loop body
            ...
    tele.close()                              # dumps the flight recorder, flushes the publisher
    ```

    Events are buffered and published in batches by a background thread (`interval_s`), never from
    the training hot path. `publisher` is any object with `publish(list[Event])` and
    `flush(timeout)`; by default a SpoolingPublisher to $CLOCKTOWER_KAFKA_BOOTSTRAP, spooling under
    $CLOCKTOWER_SPOOL_DIR (default ~/.cache/clocktower/spool) while the broker is away; closed by `close()`.
    The spool is this rank's (`rank`, else torch.distributed's, else $RANK), so a restarted rank replays it;
    made before init_process_group without $RANK (torch.multiprocessing.spawn), it is opened on first publish.
    """

    def __init__(self, job: str, *, node: str | None = None, rank: int | None = None,
                 publisher: Publisher | None = None, interval_s: float = 1.0, batch_size: int = 1000,
                 start_iteration: int = 0, cuda_sync: bool = False, gpu: int | None = None) -> None:
        self.job = job
        self.gpu = gpu if gpu is not None else local_rank()   # which GPU of its node a slow rank runs on
        self.node = node or socket.gethostname()
        self._rank = rank
        self._owns_publisher = publisher is None
        if publisher is None:
            bootstrap_from_env()    # say what to set now, not on the background thread
            # the spool is named by rank: made now if the rank is known, else on first use (see OnFirstUse)
            publisher = OnFirstUse(lambda: default_publisher(job, self.node, self._known_rank()))
            if self._known_rank() is not None:
                publisher.get()     # replays what a previous run of this rank left in its spool
        self._publisher = publisher
        self.buffer = EventBuffer(publisher, interval_s=interval_s, batch_size=batch_size)
        self.seq = SequenceCounter()
        self.hooks: list[BucketTimingHook] = []
        sync = torch.cuda.synchronize if cuda_sync and torch.cuda.is_available() else None
        self.clock = IterationClock(self._record_iteration, start=start_iteration, before_end=sync,
                                    launched=lambda: self.seq.issued)
        self.fr_buffer_size = buffer_size_from_env()
        self.flight_recorder_status = ("enabled" if self.fr_buffer_size else
                                       f"disabled: set {ENV_VARS[0]}=<entries> before init_process_group")
        self._fr: FlightRecorderReader | None = None
        self._fr_warned = False
        self.last_flight_recorder: FlightRecorderDump | None = None
        self.closed = False
        atexit.register(self._close_at_exit)   # a script that forgets close() still publishes its tail

    # --- identity ---------------------------------------------------------------
    @property
    def publisher(self) -> Publisher:
        """The publisher (the default SpoolingPublisher is made on first access if it was not yet)."""
        return self._publisher.get() if isinstance(self._publisher, OnFirstUse) else self._publisher

    def _known_rank(self) -> int | None:
        return self._rank if self._rank is not None else known_rank()

    @property
    def rank(self) -> int:
        """This process's rank: as given, else torch.distributed's (once initialized), else $RANK, else 0."""
        if self._rank is None and dist.is_initialized():
            self._rank = dist.get_rank()
        if self._rank is not None:
            return self._rank
        return int(os.environ.get("RANK", "0"))

    # --- all-reduce buckets -----------------------------------------------------
    def instrument(self, model: Any, hook: Callable[[Any, Any], Any] | None = None, state: Any = None) -> Any:
        """Register a comm hook on `model` (a DistributedDataParallel) that times every bucket; returns it.

        `hook`/`state`: an inner comm hook to wrap (e.g. fp16_compress_hook) and its state; by default
        allreduce_hook over the model's process group, which averages gradients as DDP does itself.
        DDP accepts one comm hook per model, so register yours through this argument.
        """
        from torch.nn.parallel import DistributedDataParallel
        if not isinstance(model, DistributedDataParallel):
            raise TypeError(f"instrument() takes a DistributedDataParallel model, got {type(model).__name__}")
        pg = getattr(model, "process_group", None)
        communicator = group_label(pg)
        rank = self.rank

        def record(seq: int, nbytes: int, start_ns: int, end_ns: int) -> None:
            self.buffer.add(CollectiveEvent, {
                "node": self.node, "ts_ns": time.time_ns(), "job": self.job, "rank": rank,
                "communicator": communicator, "op": "allreduce", "seq": seq, "bytes": nbytes,
                "start_ns": start_ns, "end_ns": end_ns})

        timing = BucketTimingHook(record, self.seq, inner=hook)
        self.hooks.append(timing)
        model.register_comm_hook(pg if hook is None else state, timing.as_hook())
        return model

    # --- iterations -------------------------------------------------------------
    def iteration(self, number: int | None = None) -> AbstractContextManager[int]:
        """`with tele.iteration():` times one iteration (numbered from `start_iteration`)."""
        return self.clock.iteration(number)

    def step(self, number: int | None = None) -> int:
        """Call at the top of each iteration: ends the previous one, begins the next; close() ends the last."""
        return self.clock.step(number)

    def _record_iteration(self, it: int, start_ns: int, end_ns: int, collectives: int | None) -> None:
        self.buffer.add(IterationEvent, {"node": self.node, "ts_ns": time.time_ns(), "job": self.job,
                                         "rank": self.rank, "iteration": it, "start_ns": start_ns,
                                         "end_ns": end_ns, "collectives": collectives, "gpu": self.gpu,
                                         "world_size": world_size()})

    # --- flight recorder ----------------------------------------------------------
    def dump_flight_recorder(self, include_pending: bool = False) -> FlightRecorderDump:
        """Emit a CollectiveEvent for every flight-recorder entry not emitted before (see flight_recorder)."""
        if not self.fr_buffer_size:
            if not self._fr_warned:
                warnings.warn(f"the PyTorch flight recorder is off ({self.flight_recorder_status}); "
                              "dump_flight_recorder() emits nothing", RuntimeWarning, stacklevel=2)
                self._fr_warned = True
            return FlightRecorderDump(status=self.flight_recorder_status)
        if not dist.is_initialized():
            return FlightRecorderDump(status="unavailable: torch.distributed is not initialized")
        if self._fr is None:
            self._fr = FlightRecorderReader(world_group_name=dist.group.WORLD.group_name)
        try:
            dump = dump_json(torch)
        except (AttributeError, RuntimeError, ValueError) as exc:
            self.flight_recorder_status = f"unavailable: {exc}"
            log.warning("cannot read the flight recorder: %s", exc)
            return FlightRecorderDump(status=self.flight_recorder_status)
        events, summary = self._fr.read(dump, include_pending=include_pending)
        rank, now = self.rank, time.time_ns()
        for fields in events:
            self.buffer.add(CollectiveEvent, {"node": self.node, "ts_ns": now, "job": self.job, "rank": rank,
                                              **fields})
        if summary.skipped_ops:
            log.info("flight recorder: skipped ops with no schema value: %s", dict(summary.skipped_ops))
        self.last_flight_recorder = summary
        return summary

    # --- lifecycle --------------------------------------------------------------
    def flush(self) -> int:
        """Publish everything buffered now (from the calling thread); returns the events published."""
        return self.buffer.drain()

    def close(self, timeout: float = 30.0) -> int:
        """End an open step() iteration, dump the flight recorder (pending entries too), publish and flush.

        Returns the deliveries still pending after `timeout`. Call before destroy_process_group().
        """
        if self.closed:
            return 0
        self.closed = True
        atexit.unregister(self._close_at_exit)
        self.clock.finish()
        if self.fr_buffer_size and dist.is_initialized():
            self.dump_flight_recorder(include_pending=True)
        pending = self.buffer.close(timeout)
        target = self._publisher.target if isinstance(self._publisher, OnFirstUse) else self._publisher
        if self._owns_publisher and target is not None:
            target.close(timeout=0)  # flushed above; the spool keeps the rest, the next run of this rank replays it
        return pending

    def _close_at_exit(self) -> None:
        if not self.closed:
            self.close(timeout=5.0)

    @property
    def stats(self) -> dict[str, int]:
        return {"published": self.buffer.published, "dropped": self.buffer.dropped,
                "invalid": self.buffer.invalid, "publish_errors": self.buffer.publish_errors,
                "hook_failures": sum(h.failed for h in self.hooks),
                "fr_missed": self._fr.missed if self._fr else 0,
                "fr_skipped": sum(self._fr.skipped_ops.values()) if self._fr else 0}

    def __enter__(self) -> Telemetry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
