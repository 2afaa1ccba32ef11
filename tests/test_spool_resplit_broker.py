"""Against the embedded broker (noida-db): a 2.8 MB record left in a spool by the old publisher is replayed as
parts the topics accept, each decodable under today's envelope rules, none lost, in order."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from clocktower.producers.spool import Spool, SpoolRecord
from clocktower.producers.spooling_publisher import RID_HEADER, SpoolingPublisher
from clocktower.schemas.codec import decode_batch, encode_batch
from clocktower.schemas.topics import MAX_RECORD_BYTES
from clocktower.topic_admin import ensure_topics
from tests.event_samples import gpu_health
from tests.standalone_broker import StandaloneBroker
from tests.test_record_limits_broker import _read_all

GPU = "telemetry.gpu"


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[StandaloneBroker]:
    b = StandaloneBroker(tmp_path / "kafka")
    b.start()
    ensure_topics(b.bootstrap, disable_auto_create=True)
    try:
        yield b
    finally:
        b.stop()


def test_an_old_spooled_record_over_the_limit_reaches_the_broker_in_parts(broker: StandaloneBroker,
                                                                         tmp_path: Path) -> None:
    t0 = time.time_ns()
    events = [gpu_health(node="node-old", ts_ns=t0 + i, gpu=i % 8, uuid=f"GPU-{i % 8}-" + "u" * 40)
              for i in range(5500)]
    key, value, headers = encode_batch(events)
    assert len(value) > 2.5 * MAX_RECORD_BYTES
    spool = Spool(tmp_path / "spool")
    spool.append(SpoolRecord(1, GPU, key, value, [*headers, (RID_HEADER, b"old-1")], int(time.time() * 1000)))
    spool.close()
    with SpoolingPublisher(broker.bootstrap, tmp_path / "spool") as pub:
        assert pub.flush(30) == 0
        stats = pub.stats()
    assert (stats["acked"], stats["rejected_records"], stats["resplit_records"]) == (5500, 0, 1), pub.errors
    msgs = _read_all(broker.bootstrap, GPU, 5500)
    assert len(msgs) >= 3 and all(len(m.value()) <= MAX_RECORD_BYTES for m in msgs)
    got = [e for m in sorted(msgs, key=lambda m: (m.partition(), m.offset()))
           for e in decode_batch(GPU, m.key(), m.value(), m.headers()).events]
    assert got == events
