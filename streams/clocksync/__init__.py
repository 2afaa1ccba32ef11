"""Huygens-style software clock synchronization (pure logic: no Kafka, no Faust).

Two levels: EdgeFitter (probes -> ClockEdgeFit per edge), NetworkSolver (ClockEdgeFits -> ClockEstimates),
and ClockView (ClockEstimates -> to_reference); ClockSynchronizer composes the three in one process.
"""

from clocktower.streams.clocksync.clock_view import ClockView
from clocktower.streams.clocksync.edge_fitter import EdgeFitter
from clocktower.streams.clocksync.network_solver import NetworkSolver
from clocktower.streams.clocksync.synchronizer import ClockSynchronizer

__all__ = ["ClockSynchronizer", "ClockView", "EdgeFitter", "NetworkSolver"]
