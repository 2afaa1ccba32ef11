"""What processors are built from: settings values and the shared objects of one worker.

Each processor picks what it needs in `Processor.from_context`, so the registry is a plain list of classes.
`context_from_settings` is the one place that turns the stream worker's settings into a context.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from clocktower.streams.remediation_budget import RemediationBudget

if TYPE_CHECKING:
    from clocktower.streams.settings import StreamsSettings


KNOWN_AFTER_NS = 300 * 10**9   # CLOCKTOWER_STREAMS_KNOWN_AFTER_S

@dataclass
class ProcessorContext:
    clocks: Any = None                      # ClockCorrection for the flow join: the worker's ClockView
    clock_pure_tolerance_ns: float = 2_000.0
    clock_update_ns: int = 250_000_000
    segment_ttl_ns: int = 10 * 10**9
    clock_wait_ns: int = 3 * 10**9          # a joined flow segment waits this long at most for its clock estimates
    remediation_budget: RemediationBudget = field(default_factory=RemediationBudget)
    link_watchdog_ns: int = 50 * 10**6       # a link down this long gets a failover
    link_stable_ns: int = 10 * 10**9         # carrier up this long, unchanged, gets a restore
    link_quarantine_flaps: int = 8           # more flaps than this in a sliding hour: quarantine
    spare_nodes: tuple[str, ...] = ()        # the pool a node with a lost GPU is replaced from
    fleet_nodes: frozenset[str] = frozenset()  # the nodes a replacement may be ordered for (empty: any)
    known_after_ns: int = KNOWN_AFTER_NS     # an unlisted node must have reported this long to spend the budget
    max_fault_age_ns: int = 15 * 60 * 10**9  # a replacement is ordered only for a fault reported this recently
    approval_verifier: Any = None            # CommandVerifier of the control key: operators' approvals (or None)


def context_from_settings(settings: StreamsSettings, **shared: Any) -> ProcessorContext:
    """The context of a worker run with `settings`; `shared` are the worker's objects (clocks, budget)."""
    s = settings
    return ProcessorContext(
        clock_pure_tolerance_ns=s.clock_pure_tolerance_ns, clock_update_ns=round(s.clock_update_ms * 1e6),
        segment_ttl_ns=round(s.streams_segment_ttl_s * 1e9), clock_wait_ns=round(s.streams_clock_wait_s * 1e9),
        link_watchdog_ns=round(s.streams_link_watchdog_ms * 1e6), link_stable_ns=round(s.streams_link_stable_s * 1e9),
        link_quarantine_flaps=s.streams_link_quarantine_flaps, spare_nodes=tuple(s.streams_spare_nodes),
        fleet_nodes=frozenset(s.streams_fleet_nodes), known_after_ns=round(s.streams_known_after_s * 1e9),
        max_fault_age_ns=round(s.streams_max_fault_age_s * 1e9), **shared)
