"""The fast batch decoder (schemas/fast_columns.py) agrees with pydantic on every generated record.

The corpus is real: a faulty simulated fleet's telemetry, everything the in-memory processors derive from it, and
one record of each model neither makes. Hypothesis mutates its records (bounds and one past them, wrong JSON types,
bools for ints, ints for floats, huge ints, long strings, lone surrogates, nulls, missing and extra fields,
duplicated keys, reordered times, another node, a future stamp, a wrong count) and checks that:
- the fast path accepts only what pydantic accepts, with the same values of the same types;
- `decode_columns` and `decode_batch` agree: both accept with the same columns, or both refuse with the same reason.
"""

from __future__ import annotations

import json
from functools import cache
from operator import attrgetter
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError

from clocktower.producers.simulator.config import SimConfig
from clocktower.producers.simulator.fleet import FleetSimulator
from clocktower.schemas.codec import (
    H_COUNT,
    H_SCHEMA,
    H_VERSION,
    DecodeError,
    dead_letter,
    decode_batch,
    decode_columns,
    encode_batch,
)
from clocktower.schemas.control import ControlAck, ControlCommand, ReplacementRequest
from clocktower.schemas.event import Event
from clocktower.schemas.fast_columns import decoder
from clocktower.schemas.operations import InjectedFault, StreamsTick
from clocktower.schemas.telemetry import CollectiveEvent, ConnectionState, FlowCounters, IterationEvent
from clocktower.schemas.topics import BY_MODEL, TOPICS
from clocktower.streams.processors import Processors
from tests.control_keys import TEST_SIGNER

S = 1_000_000_000
START_NS = 1_796_513_619_875_000_000
SECONDS = 8
NOW_NS = START_NS + (SECONDS + 1) * S   # the decoder's clock: every event stamped before it
SKEW_NS = 30 * S
BATCH = 6   # events per corpus record: small, so that a mutation of one event is not lost among many


def _extra_events(node: str) -> list[Event]:
    t = START_NS + S
    return [
        FlowCounters(node=node, ts_ns=t, source="tc", interface="eth0", direction="tx", src_ip="10.0.0.1",
                     dst_ip="10.0.0.2", src_port=4791, dst_port=4791, proto="roce", priority=3, bytes=4096,
                     packets=4, retransmits=0, interval_ns=100_000_000),
        FlowCounters(node=node, ts_ns=t, source="sock", direction="rx", src_ip="10.0.0.2", dst_ip="10.0.0.1",
                     src_port=5000, dst_port=40000, proto="tcp", priority=0, bytes=10, retransmits=1,
                     interval_ns=100_000_000),
        ConnectionState(node=node, ts_ns=t, src_ip="10.0.0.1", dst_ip="10.0.0.2", src_port=1, dst_port=2,
                        old_state="SYN_SENT", new_state="ESTABLISHED"),
        ControlAck(node=node, ts_ns=t, command_id="c-1", status="applied", action="failover", target="eth0",
                   apply_ns=1200),
        StreamsTick(node=node, ts_ns=t),
        InjectedFault(node=node, ts_ns=t, fault_id="f-1", kind="link_down", target="eth0", start_ns=t,
                      end_ns=t + S, detail="x"),
        dead_letter("telemetry.gpu", 3, 17, node.encode(), b'[{"node": 1}]', "invalid int_type at 0.node", "sink"),
    ]


@cache
def corpus() -> tuple[tuple[type[Event], str, bytes], ...]:
    """(model, node, value) of records of every model: a faulty fleet's telemetry and what the processors make."""
    sim = FleetSimulator(SimConfig(nodes=3, duration_s=SECONDS), start_ns=START_NS)
    processors = Processors(TEST_SIGNER)
    events: list[Event] = []
    for step in range(1, 4 * SECONDS + 1):
        batch = sim.advance(START_NS + step * S // 4)
        events += batch
        events += processors.on_batch(batch)
    events += _extra_events("node-0.demo")
    grouped: dict[tuple[type[Event], str], list[Event]] = {}
    for e in events:
        grouped.setdefault((type(e), e.node), []).append(e)
    out = []
    for (model, node), es in grouped.items():
        for i in range(0, min(len(es), 20 * BATCH), BATCH):
            out.append((model, node, encode_batch(es[i:i + BATCH])[1]))
    return tuple(out)


def _typed(v: Any) -> Any:
    """A value with its type, all the way down: 1, 1.0 and True are equal in Python but not as stored."""
    if isinstance(v, list):
        return ("list", [_typed(x) for x in v])
    return (type(v).__name__, v)


def _typed_columns(columns: list[tuple[Any, ...]]) -> list[list[Any]]:
    return [[_typed(v) for v in col] for col in columns]


def _pydantic_columns(model: type[Event], value: bytes) -> list[tuple[Any, ...]] | None:
    try:
        events = TypeAdapter(list[model]).validate_json(value)   # type: ignore[valid-type]
    except ValidationError:
        return None
    return list(zip(*map(attrgetter(*model.model_fields), events), strict=True)) if events else None


def test_every_model_but_those_with_a_pattern_or_a_map_has_a_fast_path() -> None:
    """A model losing its fast path (a new constraint or validator this module does not know) shows up here."""
    slow = {spec.model for spec in TOPICS if decoder(spec.model) is None}
    assert slow == {ControlCommand, ReplacementRequest}   # a dict of params; an approval's regex pattern


def test_every_record_of_the_corpus_takes_the_fast_path_with_pydantic_s_values() -> None:
    models = set()
    for model, _node, value in corpus():
        models.add(model)
        fast = decoder(model)
        if fast is None:
            continue
        cols = fast.columns(value)
        assert cols is not None, (model.__name__, value[:300])
        assert _typed_columns(cols) == _typed_columns(_pydantic_columns(model, value) or [])
    assert models >= {spec.model for spec in TOPICS}   # the corpus holds every model


def test_a_validator_s_column_rule_is_what_it_checks() -> None:
    """("ordered", start_ns, end_ns): pydantic refuses an end before its start, and so does the fast path."""
    for model in (CollectiveEvent, IterationEvent):
        _, node, value = next(r for r in corpus() if r[0] is model)
        rows = json.loads(value)
        rows[0]["end_ns"] = rows[0]["start_ns"] - 1
        bad = json.dumps(rows).encode()
        assert _pydantic_columns(model, bad) is None
        assert decoder(model).columns(bad) is None   # type: ignore[union-attr]
        rows[0]["end_ns"] = rows[0]["start_ns"]
        same = json.dumps(rows).encode()
        assert decoder(model).columns(same) is not None   # type: ignore[union-attr]
        assert _pydantic_columns(model, same) is not None


_BOUNDS = [0, -1, 1, 100, 101, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1, 2**64,
           -(2**63), -(2**63) - 1, 946_684_800 * S - 1, 946_684_800 * S, 4_102_444_800 * S, 4_102_444_800 * S + 1,
           10**30, -(10**30)]
_ODD = [None, True, False, 0.0, 1.0, -1.5, 1e308, 5e-324, 2.0**63, "", "x", "1", "x" * 256, "x" * 257, "é" * 256,
        "\ud800", "tx", "rx", "tcp", "roce", "allreduce", "hook", "flight_recorder", "fr:x", "infiniband",
        "applied", "open", "critical", [], [0], [0] * 64, [0] * 65, [-1], [True], [1.0], [None], ["thermal"], [""],
        ["x"] * 33, {}, {"a": "b"}]
VALUES = st.one_of(st.sampled_from(_BOUNDS), st.sampled_from(_ODD), st.integers(), st.floats(allow_nan=False),
                   st.text(max_size=300), st.lists(st.integers(min_value=-1, max_value=2**64), max_size=3))


@st.composite
def mutated(draw: st.DrawFn) -> tuple[type[Event], str, bytes, list[tuple[str, bytes]], str]:
    """A corpus record with up to three mutations: (model, key, value, headers, what was done)."""
    model, node, value = draw(st.sampled_from(corpus()))
    rows = json.loads(value)
    done = []
    for _ in range(draw(st.integers(0, 3))):
        row = rows[draw(st.integers(0, len(rows) - 1))]
        name = draw(st.sampled_from(sorted(model.model_fields)))
        kind = draw(st.sampled_from(["set", "set", "set", "delete", "extra", "future", "swap_times", "copy"]))
        if kind == "set":
            row[name] = draw(VALUES)
        elif kind == "delete":
            row.pop(name, None)
        elif kind == "extra":
            row["unexpected"] = draw(VALUES)
        elif kind == "future":
            row[name] = NOW_NS + SKEW_NS + draw(st.integers(-1, 1))
        elif kind == "swap_times" and "start_ns" in row and "end_ns" in row:
            row["start_ns"], row["end_ns"] = row["end_ns"], row["start_ns"]
        elif kind == "copy":
            row[name] = draw(st.sampled_from(rows)).get(name)
        done.append(f"{kind} {name}")
    text = json.dumps(rows)
    if draw(st.booleans()) and text.startswith('[{"'):
        text = '[{"node": "someone-else", ' + text[2:]   # a duplicated key: the last one counts, in both parsers
        done.append("duplicate node")
    key = node if draw(st.integers(0, 9)) else draw(st.sampled_from(["someone-else", ""]))
    count = len(rows) + draw(st.sampled_from([0, 0, 0, 0, 1, -1]))
    headers = [(H_SCHEMA, model.SCHEMA.encode()), (H_VERSION, str(model.VERSION).encode()),
               (H_COUNT, str(count).encode())]
    return model, key, text.encode(), headers, "; ".join(done)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_fast_path_and_pydantic_agree_on_mutated_records(record: tuple) -> None:
    model, key, value, headers, done = record
    fast = decoder(model)
    if fast is not None:
        cols = fast.columns(value)
        if cols is not None:
            expected = _pydantic_columns(model, value)
            assert expected is not None, f"fast path accepted what pydantic refuses ({done})"
            assert _typed_columns(cols) == _typed_columns(expected), done
    topic = BY_MODEL[model].name
    try:
        batch = decode_batch(topic, key.encode(), value, headers, max_future_skew_ns=SKEW_NS, now_ns=NOW_NS)
    except DecodeError as exc:
        try:
            got = decode_columns(topic, key.encode(), value, headers, max_future_skew_ns=SKEW_NS, now_ns=NOW_NS)
        except DecodeError as again:
            assert str(again) == str(exc), done
        else:
            raise AssertionError(f"decode_columns accepted ({got.rows} rows) what decode_batch refused: {exc} ({done})")
        return
    got = decode_columns(topic, key.encode(), value, headers, max_future_skew_ns=SKEW_NS, now_ns=NOW_NS)
    assert (got.schema, got.node, got.rows) == (batch.schema, batch.node, len(batch.events)), done
    expected = list(zip(*map(attrgetter(*model.model_fields), batch.events), strict=True))
    assert _typed_columns(got.columns) == _typed_columns(expected), done
