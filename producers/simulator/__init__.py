"""The fleet simulator: synthetic telemetry of a GPU training fleet, with injected faults."""

from producers.simulator.config import SimConfig
from producers.simulator.fleet import FleetSimulator
from producers.simulator.runner import run_simulation

__all__ = ["FleetSimulator", "SimConfig", "run_simulation"]
