"""Which partition a key goes to, when the writer picks it explicitly: one stable hash, shared by every side.

The streams regroup records by their own keys with it, and they send each control command to the partition of
its node, which is the one partition that node's actuator assigns itself. Kafka clients' own partitioners
differ (librdkafka's consistent_random vs the Java/aiokafka murmur2), so nothing here relies on them.
"""

from __future__ import annotations

import zlib


def partition_of(key: str, partitions: int) -> int:
    """The partition of `key` among `partitions`: crc32, the same in every process, worker and release."""
    if partitions < 1:
        raise ValueError(f"a topic has at least one partition, got {partitions}")
    return zlib.crc32(key.encode()) % partitions
