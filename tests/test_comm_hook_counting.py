"""An iteration's `collectives` counts only the buckets the comm hook records (a failed all-reduce is not)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from clocktower.producers.pytorch.comm_hook import BucketTimingHook, SequenceCounter
from clocktower.producers.pytorch.iterations import IterationClock


class _Future:
    """The part of torch.futures.Future the hook uses; completes when the test says so."""

    def __init__(self, error: Exception | None = None) -> None:
        self.error = error
        self.callbacks: list[Callable[[Any], Any]] = []

    def then(self, cb: Callable[[Any], Any]) -> _Future:
        self.callbacks.append(cb)
        return self

    def value(self) -> str:
        if self.error is not None:
            raise self.error
        return "reduced"

    def complete(self) -> Any:
        return self.callbacks[0](self)


class _Buffer:
    def numel(self) -> int:
        return 4

    def element_size(self) -> int:
        return 4


class _Bucket:
    def buffer(self) -> _Buffer:
        return _Buffer()


def test_a_failed_all_reduce_is_not_counted_in_its_iteration() -> None:
    recorded: list[tuple[int, int, int, int]] = []
    iterations: list[tuple[int, int, int, int | None]] = []
    seq = SequenceCounter()
    futures = [_Future(), _Future(RuntimeError("peer gone")), _Future()]
    hook = BucketTimingHook(lambda *a: recorded.append(a), seq, inner=lambda state, bucket: futures.pop(0))
    clock = IterationClock(lambda *a: iterations.append(a), launched=lambda: seq.issued)
    with clock.iteration():
        done = [hook.run(None, _Bucket()) for _ in range(3)]
        assert done[0].complete() == "reduced"
        with pytest.raises(RuntimeError, match="peer gone"):   # re-raised into DDP, never swallowed
            done[1].complete()
        done[2].complete()
    assert [r[:2] for r in recorded] == [(0, 16), (2, 16)]       # seq stays launch order
    assert (hook.failed, [i[3] for i in iterations]) == (1, [2])  # 2 recorded, 2 counted
