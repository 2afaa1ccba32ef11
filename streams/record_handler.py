"""One input record in, the records to publish out; nothing a record holds can stop the worker.

A record that fails decoding is skipped and counted (the sink dead-letters it). An
event of a decoded batch that raises does not cost the others their outputs: those are
published (the detectors' state has moved on for them), and the record is dead-lettered
once with detector="streams" and a reason naming the failed events, and counted. Any
other exception dead-letters the record the same way; the worker goes on either way.

The handler decodes and checks; a router (the in-memory `Processors`, or the Faust app's topology) says
which records a decoded batch makes. Records of a repartition topic (`internal=True`) were written by the
streams themselves: they are decoded as the topic their schema belongs on, and carry no producer identity.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from functools import partial
from typing import Protocol

from clocktower.schemas.codec import (
    DEFAULT_MAX_FUTURE_SKEW_NS,
    H_SCHEMA,
    DecodeError,
    bounded,
    dead_letter,
    decode_batch,
    encode_batch,
)
from clocktower.schemas.event import Event
from clocktower.schemas.record_mac import NodeSigning, check
from clocktower.schemas.topics import BY_SCHEMA
from clocktower.streams import metrics
from clocktower.streams.emit import Out
from clocktower.streams.event_failure import EventFailure, failure_reason
from clocktower.streams.remediation_budget import RemediationBudget

log = logging.getLogger(__name__)
DEADLETTER_TOPIC = "deadletter"
# (topic, key, headers) -> None if the producer may speak for this key, else the reason it may not.
IdentityCheck = Callable[[str, bytes | None, bytes | None, Sequence[tuple[str, bytes | None]]], str | None]


def identity_check(signing: NodeSigning) -> IdentityCheck | None:
    """With CLOCKTOWER_PRODUCER_KEY set, only records signed by the node they are keyed by are processed."""
    key = signing.producer_key_bytes()
    return partial(check, key) if key else None


class Router(Protocol):
    budget: RemediationBudget

    def route(self, topic: str, partition: int, events: Sequence[Event],
              failures: list[EventFailure], offset: int | None = None) -> list[Out]: ...


def _source_topic(headers: Sequence[tuple[str, bytes | None]]) -> str:
    """The topic a repartitioned record's schema belongs on (decode_batch checks the schema against it)."""
    for k, v in headers:
        if k == H_SCHEMA and v is not None and (spec := BY_SCHEMA.get(v.decode("utf-8", "replace"))):
            return spec.name
    return "?"   # decode_batch refuses it: unknown topic


class RecordHandler:
    def __init__(self, router: Router, identity: IdentityCheck | None = None,
                 max_future_skew_ns: int = DEFAULT_MAX_FUTURE_SKEW_NS, internal: bool = False,
                 sign_outputs: Callable[[Out], Out] | None = None) -> None:
        self.router = router
        self.sign_outputs = sign_outputs   # streams/node_signed_outputs.py: what the streams read back, signed
        self.max_future_skew_ns = max_future_skew_ns   # CLOCKTOWER_MAX_FUTURE_SKEW_S
        self.identity = None if internal else identity
        self.internal = internal
        self._withheld_seen = 0

    def handle(self, topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None,
               headers: Sequence[tuple[str, bytes | None]]) -> list[Out]:
        metrics.RECORDS.labels(topic).inc()
        try:
            batch = decode_batch(_source_topic(headers) if self.internal else topic, key, value, headers,
                                 max_future_skew_ns=self.max_future_skew_ns, mixed_nodes=self.internal)
        except DecodeError as exc:
            metrics.DECODE_FAILURES.labels(topic).inc()
            log.warning("skipping bad record on %s: %s", topic, bounded(str(exc), 500))
            return []
        try:
            refused = self.identity(topic, key, value, headers) if self.identity else None
            if refused is not None:
                metrics.IDENTITY_REJECTS.labels(topic).inc()
                return self._dead_letter(topic, partition, offset, key, value, f"identity: {refused}")
            failures: list[EventFailure] = []
            out = self.router.route(topic, partition, batch.events, failures, offset)
            if self.sign_outputs is not None:
                out = [self.sign_outputs(o) for o in out]
            if failures:
                metrics.BATCH_FAILURES.labels(topic).inc()
                reason = failure_reason(failures, len(batch.events))
                log.error("processing %s[%d]@%d: %s; dead-lettered, the other events' outputs published", topic,
                          partition, offset, bounded(reason, 2000), exc_info=failures[0].error)
                out += self._dead_letter(topic, partition, offset, key, value, reason)
        except Exception as exc:  # noqa: BLE001 - one bad batch is dead-lettered, the worker goes on
            metrics.BATCH_FAILURES.labels(topic).inc()
            log.exception("processing %s[%d]@%d failed; dead-lettered", topic, partition, offset)
            return self._dead_letter(topic, partition, offset, key, value,
                                     f"streams error: {type(exc).__name__}: {exc}")
        withheld = self.router.budget.withheld
        if withheld > self._withheld_seen:
            metrics.REMEDIATION_WITHHELD.inc(withheld - self._withheld_seen)
            self._withheld_seen = withheld
        return out

    def _dead_letter(self, topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None,
                     reason: str) -> list[Out]:
        try:
            k, v, h = encode_batch([dead_letter(topic, partition, offset, key, value, reason, "streams")])
        except Exception:  # noqa: BLE001 - cannot happen with bounded fields; never let it stop the worker
            log.exception("dead letter for %s[%d]@%d could not be built; skipped", topic, partition, offset)
            return []
        return [Out(DEADLETTER_TOPIC, k, v, h)]
