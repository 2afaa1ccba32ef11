"""PyTorch integration for training scripts: one import and two lines.

    from clocktower.producers.pytorch import Telemetry
    tele = Telemetry(job="llm-7b")                 # node = hostname, rank from torch.distributed
    model = tele.instrument(DDP(model))            # times every all-reduce bucket (comm hook)
    for batch in loader:
        with tele.iteration():                     # IterationEvent per rank (or tele.step())
            ...
    tele.dump_flight_recorder()                    # every collective with its sequence id
    tele.close()

`Telemetry` needs torch (`pip install torch==2.13.0`); it is imported on first use, so
`producers.pytorch.flight_recorder` and the other helpers import without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from clocktower.producers.pytorch.telemetry import Telemetry

__all__ = ["Telemetry"]


def __getattr__(name: str) -> Any:
    if name == "Telemetry":
        from clocktower.producers.pytorch.telemetry import Telemetry  # raises ImportError naming `pip install torch`
        return Telemetry
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
