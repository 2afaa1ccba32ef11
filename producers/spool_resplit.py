"""Cut a spooled record written under the old, larger record limit into records that fit today's.

Spools written before MAX_RECORD_BYTES came down to 1 MiB (values up to 4 MiB, messages up to 8 MiB) still hold
such records. The broker would refuse them for good, losing their events, so the replayer decodes them (under the
rules they were written under), cuts the batch again as the publisher does and sends the parts in its place. Only
a record that does not decode as our envelope is refused. The cut is deterministic, so each part keeps the same
index, and so the same `ct-rid`, on every replay: the read-back check finds the parts Kafka already has.
"""

from __future__ import annotations

from dataclasses import dataclass

from clocktower.producers.spool import SpoolRecord
from clocktower.schemas.batch_split import EncodedRecord, encode_records
from clocktower.schemas.codec import decode_batch
from clocktower.schemas.event import Event


@dataclass(frozen=True)
class Resplit:
    """The parts of one oversized record (in order), and the events too big for a record on their own."""

    schema: str
    parts: list[EncodedRecord]
    refused: list[tuple[Event, int]]


def resplit(rec: SpoolRecord, max_bytes: int) -> Resplit:
    """The parts of `rec`, none over `max_bytes`; DecodeError when it is not a record of ours."""
    batch = decode_batch(rec.topic, rec.key, rec.value, rec.headers, envelope_checks=False)
    split = encode_records(batch.events, max_bytes)
    return Resplit(batch.schema, split.records, split.oversized)


def part_rid(parent_rid: bytes, index: int) -> bytes:
    """The `ct-rid` of part `index` of the record whose ct-rid is `parent_rid`: the same on every replay."""
    return parent_rid + b"/" + str(index).encode()
