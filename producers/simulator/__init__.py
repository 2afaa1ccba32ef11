"""The fleet simulator: synthetic telemetry of a GPU training fleet, with injected faults."""

from clocktower.producers.simulator.config import SimConfig
from clocktower.producers.simulator.fleet import FleetSimulator
from clocktower.producers.simulator.runner import run_simulation

__all__ = ["FleetSimulator", "SimConfig", "run_simulation"]
