"""Huygens-style software clock synchronization (pure logic: no Kafka, no Faust)."""

from clocktower.streams.clocksync.synchronizer import ClockSynchronizer

__all__ = ["ClockSynchronizer"]
