"""The Faust app object, configured as a clocktower stream worker needs it: what each option protects against.

Only configuration: the agents, tables and timers are added by streams/engine/faust_worker.py.
"""

from __future__ import annotations

import faust

from clocktower.schemas.kafka_security import KafkaSecurity
from clocktower.schemas.topics import MAX_MESSAGE_BYTES
from clocktower.streams.engine.kafka_credentials import faust_credentials
from clocktower.streams.engine.quiet_worker import QuietWorker
from clocktower.streams.registry import APP_ID
from clocktower.streams.settings import StreamsSettings


def faust_app(settings: StreamsSettings, instance_id: str, security: KafkaSecurity) -> faust.App:
    return faust.App(
        APP_ID,
        broker=f"kafka://{settings.bootstrap}",
        broker_credentials=faust_credentials(security),   # CLOCKTOWER_KAFKA_* SASL/mTLS
        store="rocksdb://",              # rocksdict (the python-rocksdb binding is not installed)
        datadir=str(settings.data_dir / "streams" / instance_id),   # one per worker: a store is one process's
        table_standby_replicas=0,
        web_enabled=False,
        web_bind="127.0.0.1",
        topic_disable_leader=True,
        topic_allow_declare=False,       # the topic setup creates every topic, internal ones included
        consumer_auto_offset_reset="earliest",
        broker_session_timeout=10.0,
        # Static membership: a worker restarted after a crash takes its partitions back at once
        # (noida-db never completes the rebalance that would otherwise wait for the dead member).
        consumer_group_instance_id=instance_id,
        producer_acks=-1,
        stream_wait_empty=True,    # a rebalance waits for the events in flight: none dropped, so no gap holds commits
        producer_compression_type="lz4",
        # Under a live stream of small records, a produce request per record cost the worker a quarter of its CPU
        # (aiokafka's sender and socket writes; py-spy, issue 19): a few ms of linger gather them.
        producer_linger=settings.streams_producer_linger_ms / 1000,
        producer_max_request_size=MAX_MESSAGE_BYTES,   # records up to the topics' limit (Faust's default: 1,000,000)
        Worker=QuietWorker,        # no spinner: Faust's sets the root logger to DEBUG (streams/engine/quiet_worker.py)
    )
