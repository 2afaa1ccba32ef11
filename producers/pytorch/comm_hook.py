"""A DDP communication hook that times every gradient bucket's all-reduce.

It wraps an inner hook, by default `allreduce_hook` (sum across ranks, divided by the world size: the
same averaging DDP does without a hook, so training is unchanged). Per bucket it records

- start_ns: when DDP calls the hook (the bucket's gradients are ready and the all-reduce is launched),
- end_ns: when the all-reduce future completes (a `fut.then` callback),
- bytes: the bucket buffer's numel * element_size (before any compression an inner hook applies),
- seq: a per-rank counter shared by every model instrumented by one Telemetry, taken at launch, so
  seq order is launch order.

A bucket whose all-reduce fails is not recorded, and no longer counts as launched (`issued`): an
iteration's `collectives` is what the stream can receive, else it waits in vain for the missing ones.

Under gloo the future completes when the collective has finished. Under NCCL the `then` callback
runs once the work is enqueued on the CUDA stream, so end_ns is host-side and can be early; the
flight recorder (with TORCH_NCCL_ENABLE_TIMING) is the better source of NCCL durations.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from typing import Any

# record(seq, bytes, start_ns, end_ns); called on whichever thread completes the future
Recorder = Callable[[int, int, int, int], None]


class SequenceCounter:
    """A thread-safe per-rank sequence number: 0, 1, 2, ..."""

    def __init__(self, start: int = 0) -> None:
        self._count = itertools.count(start)
        self._lock = threading.Lock()
        self.issued = 0      # collectives launched so far, less those that failed: what will be recorded

    def next(self) -> int:
        with self._lock:
            self.issued += 1
            return next(self._count)

    def withdraw(self) -> None:
        """A collective numbered by next() failed: it is not recorded, so it no longer counts as issued."""
        with self._lock:
            self.issued -= 1


class BucketTimingHook:
    """Times an inner comm hook: `ddp.register_comm_hook(state, BucketTimingHook(...).as_hook())`."""

    def __init__(self, record: Recorder, seq: SequenceCounter, inner: Callable[[Any, Any], Any] | None = None
                 ) -> None:
        if inner is None:
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
            inner = allreduce_hook
        self.inner = inner
        self.record = record
        self.seq = seq
        self.failed = 0   # buckets whose all-reduce future completed with an error

    def as_hook(self) -> Callable[..., Any]:
        """The function to register. DDP inspects it: it must be a function (DDP reads `__name__`) whose
        `bucket` parameter and return are unannotated or exactly GradBucket / Future[Tensor]."""

        def clocktower_timed_hook(state, bucket):  # noqa: ANN001, ANN202 - DDP rejects other annotations
            return self.run(state, bucket)

        return clocktower_timed_hook

    def run(self, state: Any, bucket: Any) -> Any:
        """(state, dist.GradBucket) -> torch.futures.Future[Tensor]: time the inner hook's future."""
        start_ns = time.time_ns()
        buf = bucket.buffer()
        nbytes = buf.numel() * buf.element_size()
        seq = self.seq.next()
        fut = self.inner(state, bucket)

        def done(f: Any) -> Any:
            end_ns = time.time_ns()
            try:
                value = f.value()       # re-raises the collective's error into DDP: never swallow it
            except Exception:
                self.failed += 1
                self.seq.withdraw()   # DDP waits on this future in backward: before the iteration's count is read
                raise
            self.record(seq, nbytes, start_ns, end_ns)
            return value

        return fut.then(done)
