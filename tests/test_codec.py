"""The batch envelope: round trips for every schema, and every kind of bad input rejected with a reason."""

from __future__ import annotations

import contextlib
import typing

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clocktower.schemas.codec import MAX_RECORD_BYTES, DecodeError, dead_letter, decode_batch, encode_batch
from clocktower.schemas.telemetry import FlowSample, LinkState
from clocktower.schemas.topics import TOPICS, topic_for

NOW = 1_780_000_000 * 10**9
TS_MAX = 4_102_444_800 * 10**9   # TimestampNs's upper bound


def _from_schema(schema: dict) -> st.SearchStrategy:
    """Values valid for a JSON Schema of a nullable, list, number, bool or string field, within its bounds."""
    if "anyOf" in schema:
        return st.one_of(*(_from_schema(s) for s in schema["anyOf"]))
    kind = schema["type"]
    if kind == "null":
        return st.none()
    if kind == "array":
        return st.lists(_from_schema(schema["items"]), max_size=min(schema.get("maxItems", 4), 4))
    if kind == "integer":
        return st.integers(schema.get("minimum"), schema.get("maximum"))
    if kind == "number":
        return st.floats(schema.get("minimum"), schema.get("maximum"), allow_nan=False, allow_infinity=False)
    if kind == "boolean":
        return st.booleans()
    return st.text(min_size=schema.get("minLength", 0), max_size=min(schema.get("maxLength", 16), 16))


def _link(node: str = "node-0", **kw) -> LinkState:
    base = dict(node=node, ts_ns=NOW, interface="eth0", kind="ethernet", up=True, carrier_changes=0,
                speed_mbps=400_000, operstate="up", carrier=True)
    return LinkState(**{**base, **kw})


@pytest.mark.parametrize("spec", TOPICS, ids=lambda t: t.name)
@settings(max_examples=15, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(data=st.data())
def test_round_trip_every_schema(spec, data) -> None:
    extra = {}
    if "start_ns" in spec.model.model_fields:  # keep end >= start, which the models enforce
        extra = {"start_ns": st.just(NOW), "end_ns": st.integers(NOW, NOW + 10**12)}
        if "end_ns" not in spec.model.model_fields:
            del extra["end_ns"]
    for name, field in spec.model.model_fields.items():
        if field.annotation is float:  # hypothesis ignores allow_inf_nan=False in the annotation
            extra[name] = st.floats(allow_nan=False, allow_infinity=False)
        elif name not in extra and (type(None) in typing.get_args(field.annotation)
                                    or typing.get_origin(field.annotation) is list
                                    or any(name in f for f in spec.model.REQUIRED_WHEN.values())):
            # hypothesis misses the bounds of `T | None` and of list items, and builds only required fields
            extra[name] = _from_schema(spec.model.model_json_schema()["properties"][name])
    model = st.builds(spec.model, node=st.just("node-7"), **extra)
    events = data.draw(st.lists(model, min_size=1, max_size=4))
    key, value, headers = encode_batch(events)
    decoded = decode_batch(spec.name, key, value, headers, now_ns=TS_MAX)  # any valid timestamp is in the past
    assert decoded.events == events
    assert decoded.node == "node-7"
    assert decoded.schema == spec.model.SCHEMA


def _record(events=None):
    events = events or [_link()]
    return encode_batch(events)


def _decode(key, value, headers, topic="telemetry.links"):
    return decode_batch(topic, key, value, headers)


@pytest.mark.parametrize(("mutate", "reason"), [
    (lambda k, v, h: (k, b"{not json", h), "invalid json"),
    (lambda k, v, h: (k, v.replace(b'"up":true', b'"up":"maybe"'), h), "up"),
    (lambda k, v, h: (k, v.replace(b'"carrier_changes":0', b'"carrier_changes":-1'), h), "carrier_changes"),
    (lambda k, v, h: (k, v.replace(b'"kind":"ethernet"', b'"kind":"token-ring"'), h), "kind"),
    (lambda k, v, h: (k, v.replace(b'"interface"', b'"bogus":1,"interface"'), h), "extra"),
    (lambda k, v, h: (k, orjson.dumps([{"node": "node-0"}]), h), "missing"),
    (lambda k, v, h: (k, b"[]", h), "empty batch"),
    (lambda k, v, h: (k, b"x" * (MAX_RECORD_BYTES + 1), h), "oversized"),
    (lambda k, v, h: (k, None, h), "empty record"),
    (lambda k, v, h: (k, v, []), "missing header"),
    (lambda k, v, h: (k, v, [("ct-schema", b"nope"), ("ct-version", b"1")]), "unknown schema"),
    (lambda k, v, h: (k, v, [("ct-schema", b"link_state"), ("ct-version", b"99")]), "unsupported version"),
    (lambda k, v, h: (k, v, [("ct-schema", b"flow_sample"), ("ct-version", b"1")]), "does not belong"),
    (lambda k, v, h: (b"node-9", v, h), "batch keyed"),
    (lambda k, v, h: (k, v.replace(str(NOW).encode(), b"12"), h), "ts_ns"),
])
def test_bad_input_is_rejected_with_reason(mutate, reason) -> None:
    key, value, headers = mutate(*_record())
    with pytest.raises(DecodeError) as exc:
        _decode(key, value, headers)
    assert reason.lower() in str(exc.value).lower()


@settings(max_examples=300, deadline=None)
@given(value=st.binary(max_size=512), schema=st.sampled_from([b"link_state", b"flow_sample", b"x", b""]),
       version=st.sampled_from([b"1", b"2", b""]), key=st.one_of(st.none(), st.binary(max_size=16)))
def test_arbitrary_bytes_never_crash(value, schema, version, key) -> None:
    with contextlib.suppress(DecodeError):
        _decode(key, value, [("ct-schema", schema), ("ct-version", version)])


def test_encode_refuses_mixed_batches() -> None:
    with pytest.raises(ValueError, match="mixed nodes"):
        encode_batch([_link("a"), _link("b")])
    flow = FlowSample(node="a", ts_ns=NOW, interface="eth0", direction="tx", src_ip="x", dst_ip="y", src_port=1,
                      dst_port=2, proto="tcp", seq=1, bytes=1, packets=1, retransmits=0, priority=0)
    with pytest.raises(ValueError, match="mixed schemas"):
        encode_batch([_link("a"), flow])
    with pytest.raises(ValueError, match="empty"):
        encode_batch([])


def test_a_regrouped_record_carries_many_nodes_and_only_the_streams_own_read_accepts_it() -> None:
    """The streams' repartition records carry every node's events of a partition's part in one record; read as
    a node's record (anything a node publishes), a mixed one is refused."""
    key, value, headers = encode_batch([_link("a"), _link("b"), _link("a", interface="eth1")], mixed_nodes=True)
    assert key == b"a"
    batch = decode_batch("telemetry.links", key, value, headers, now_ns=NOW, mixed_nodes=True)
    assert [(e.node, e.interface) for e in batch.events] == [("a", "eth0"), ("b", "eth0"), ("a", "eth1")]
    with pytest.raises(DecodeError, match="event from node 'b' in a batch keyed 'a'"):
        decode_batch("telemetry.links", key, value, headers, now_ns=NOW)


def test_dead_letter_keeps_origin_and_raw_bytes() -> None:
    import base64

    dl = dead_letter("telemetry.links", 3, 42, b"node-1", b"\x00garbage", "invalid json", "sink")
    assert (dl.origin_topic, dl.origin_partition, dl.origin_offset, dl.node) == ("telemetry.links", 3, 42, "node-1")
    assert base64.b64decode(dl.raw_b64) == b"\x00garbage"
    key, value, headers = encode_batch([dl])
    assert decode_batch(topic_for(type(dl)).name, key, value, headers).events == [dl]
