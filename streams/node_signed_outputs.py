"""What the streams publish in a node's name and read back under the identity check: signed with that node's key.

control.replacements carries requests to drain a node and bring a spare. With CLOCKTOWER_PRODUCER_KEY set the
streams check node signatures on what they read from it, as on telemetry (streams/topology.py), so a client that
can write the topic cannot get a node drained. The streams hold the producer key: they derive the key of the node
a request is keyed by (the faulty node) and sign the record with it (schemas/record_mac.py). control.ticks, each
worker's tick that has the allocator re-check withheld requests (schemas/operations.py StreamsTick), is signed the
same way in the worker's name, so that a client without the key cannot time those re-checks either.
analytics.flow_latency is signed in the receiving node's name: the congestion detector reads it back and orders
QoS from it (rate_limit, pause), so a client that can write the topic must not be able to invent a congestion.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from clocktower.schemas.analytics import FlowLatency
from clocktower.schemas.control import ReplacementRequest
from clocktower.schemas.operations import StreamsTick
from clocktower.schemas.record_mac import NodeSigning, node_key, sign
from clocktower.schemas.topics import BY_MODEL
from clocktower.streams.emit import Out

SIGNED_TOPICS = frozenset({BY_MODEL[ReplacementRequest].name, BY_MODEL[StreamsTick].name, BY_MODEL[FlowLatency].name})

OutputSigner = Callable[[Out], Out]


def _sign(producer_key: bytes, out: Out) -> Out:
    if out.topic not in SIGNED_TOPICS:
        return out
    key = node_key(producer_key, out.key.decode("utf-8", "replace"))
    return out._replace(headers=sign(key, out.topic, out.key, out.value, list(out.headers)))


def output_signer(signing: NodeSigning) -> OutputSigner | None:
    """With CLOCKTOWER_PRODUCER_KEY set, signs the outputs on SIGNED_TOPICS; None (nothing to sign) without it."""
    key = signing.producer_key_bytes()
    return partial(_sign, key) if key else None
