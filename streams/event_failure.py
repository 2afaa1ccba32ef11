"""What went wrong with one event of a batch, and the dead-letter reason that names it.

A batch's events are processed one by one: when one raises, the outputs of the
others are still published (the detectors' state already moved on for them), and
the record is dead-lettered once with a reason that says which events failed.
"""

from __future__ import annotations

from dataclasses import dataclass

from clocktower.schemas.codec import bounded

REASON_ERROR_LIMIT = 1000   # characters of the first error kept in the reason


@dataclass(frozen=True)
class EventFailure:
    index: int | None   # position of the event in its batch; None for the batch's clock update
    error: Exception


def failure_reason(failures: list[EventFailure], batch_size: int) -> str:
    """A bounded reason: how many of the batch's events failed, which ones, and the first error."""
    at = [f"#{f.index}" if f.index is not None else "clock update" for f in failures]
    where = ", ".join(at[:10]) + (f" (+{len(at) - 10} more)" if len(at) > 10 else "")
    first = failures[0].error
    error = bounded(f"{type(first).__name__}: {first}", REASON_ERROR_LIMIT)
    return f"streams error: {len(failures)} of {batch_size} events failed ({where}); first: {error}"
