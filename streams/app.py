"""The Faust app: thin agents that decode telemetry batches and publish what the processors derive.

Run it with `python -m clocktower.streams` (clocktower starts it for you). What happens to
each record, bad ones included, is decided in streams/record_handler.py.
"""

from __future__ import annotations

import logging
import socket

import faust

from clocktower.schemas.kafka_security import KafkaSecurity
from clocktower.schemas.record_mac import NodeSigning
from clocktower.schemas.topics import MAX_MESSAGE_BYTES
from clocktower.streams.idle_fetch import install as install_idle_fetch_backoff
from clocktower.streams.inputs import INPUT_TOPICS
from clocktower.streams.kafka_credentials import faust_credentials
from clocktower.streams.processors import Processors
from clocktower.streams.record_handler import RecordHandler, identity_check
from clocktower.streams.remediation_budget import RemediationBudget
from clocktower.streams.settings import StreamsSettings

log = logging.getLogger(__name__)
settings = StreamsSettings()
install_idle_fetch_backoff(settings.streams_idle_fetch_backoff_ms / 1000)   # the broker answers empty fetches at once

app = faust.App(
    "clocktower-streams",
    broker=f"kafka://{settings.bootstrap}",
    broker_credentials=faust_credentials(KafkaSecurity()),   # CLOCKTOWER_KAFKA_* SASL/mTLS
    store="memory://",
    datadir=str(settings.data_dir / "streams"),
    web_enabled=False,
    web_bind="127.0.0.1",
    topic_disable_leader=True,
    topic_allow_declare=False,
    consumer_auto_offset_reset="earliest",
    broker_session_timeout=10.0,
    # Static membership: a worker restarted after a crash takes its partitions back at once
    # (noida-db never completes the rebalance that would otherwise wait for the dead member).
    consumer_group_instance_id=settings.streams_instance_id or f"clocktower-streams-{socket.gethostname()}",
    producer_acks=-1,
    stream_wait_empty=False,
    producer_compression_type="lz4",
    producer_max_request_size=MAX_MESSAGE_BYTES,   # records up to the topics' limit (Faust's default: 1,000,000)
)
processors = Processors(settings.control_key_bytes(), clock_pure_tolerance_ns=settings.clock_pure_tolerance_ns,
                        clock_update_ns=round(settings.clock_update_ms * 1e6),
                        remediation_budget=RemediationBudget(settings.remediation_max_per_hour))
handler = RecordHandler(processors, identity=identity_check(NodeSigning()),
                        max_future_skew_ns=settings.max_future_skew_ns)   # CLOCKTOWER_MAX_FUTURE_SKEW_S

_INPUTS = INPUT_TOPICS
_topics = {name: app.topic(name, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")
           for name in _INPUTS}
_outputs = {}


def _out(topic: str) -> faust.TopicT:
    if topic not in _outputs:
        _outputs[topic] = app.topic(topic, key_serializer="raw", value_serializer="raw")
    return _outputs[topic]


async def _process(name: str, stream: faust.StreamT) -> None:
    async for event in stream.events():
        headers = [(k, v) for k, v in (event.headers or {}).items()]
        msg = event.message
        for topic, key, value, hdrs in handler.handle(name, msg.partition, msg.offset, event.key, event.value,
                                                      headers):
            await _out(topic).send(key=key, value=value, headers=hdrs)


def _agent_for(name: str) -> None:
    async def agent(stream: faust.StreamT) -> None:
        await _process(name, stream)

    agent.__name__ = "agent_" + name.replace(".", "_")
    app.agent(_topics[name], name=agent.__name__)(agent)


for _name in _INPUTS:
    _agent_for(_name)
