"""Huygens-style software clock synchronization (pure logic: no Kafka, no Faust)."""

from streams.clocksync.synchronizer import ClockSynchronizer

__all__ = ["ClockSynchronizer"]
