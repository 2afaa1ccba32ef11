"""Who may speak for a node: with CLOCKTOWER_PRODUCER_KEY set, the streams act only on records signed by their node."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from clocktower.producers.kafka_publisher import KafkaPublisher
from clocktower.schemas.codec import decode_batch, encode_batch
from clocktower.schemas.control import ControlAck, ReplacementRequest
from clocktower.schemas.operations import StreamsTick
from clocktower.schemas.record_mac import H_NODE_MAC, NodeSigning, node_key
from clocktower.schemas.telemetry import GpuHealth
from clocktower.streams.emit import Out, records
from clocktower.streams.node_signed_outputs import output_signer
from clocktower.streams.processors import Processors
from clocktower.streams.record_handler import RecordHandler, identity_check
from tests.control_keys import TEST_SIGNER
from tests.event_samples import GPU_READINGS

T0 = 1_780_000_000 * 10**9
PRODUCER_KEY = b"p" * 32
TOPIC = "telemetry.gpu"


def _xid79(node: str) -> tuple[bytes, bytes, list]:
    return encode_batch([GpuHealth(node=node, ts_ns=T0, gpu=0, uuid="GPU-0", **{**GPU_READINGS, "xid": 79})])


def _handler() -> RecordHandler:
    check = identity_check(NodeSigning(producer_key=PRODUCER_KEY.decode()))
    assert check is not None
    return RecordHandler(Processors(TEST_SIGNER, clock_ns=lambda: T0, known_after_ns=0), identity=check)


def _actions(out: list) -> list[str]:
    return [e.action for t, k, v, h, _ in out if t == "control.commands" for e in decode_batch(t, k, v, h).events]


def _reason(out: list) -> str:
    [(topic, k, v, h, _)] = out
    assert topic == "deadletter"
    dl = decode_batch(topic, k, v, h).events[0]
    assert dl.detector == "streams"
    return dl.reason


def test_a_node_signed_record_is_acted_on() -> None:
    pub = KafkaPublisher("127.0.0.1:1", node_key=node_key(PRODUCER_KEY, "node-1"))
    key, value, headers = pub.signed(TOPIC, *_xid79("node-1"))
    assert any(h == H_NODE_MAC for h, _ in headers)
    assert _actions(_handler().handle(TOPIC, 0, 1, key, value, headers)) == ["drain"]   # no spare pool configured


def test_an_anonymous_xid79_drains_nothing() -> None:
    out = _handler().handle(TOPIC, 0, 1, *_xid79("node-1"))
    assert "identity: record is not signed" in _reason(out)


def test_a_node_cannot_speak_for_another() -> None:
    pub = KafkaPublisher("127.0.0.1:1", node_key=node_key(PRODUCER_KEY, "node-2"))   # node-2's own key
    out = _handler().handle(TOPIC, 0, 1, *pub.signed(TOPIC, *_xid79("node-1")))     # a record keyed node-1
    assert "does not match the key's node" in _reason(out)


def test_an_altered_record_is_refused() -> None:
    pub = KafkaPublisher("127.0.0.1:1", node_key=node_key(PRODUCER_KEY, "node-1"))
    key, value, headers = pub.signed(TOPIC, *_xid79("node-1"))
    _, other_value, _ = encode_batch([GpuHealth(node="node-1", ts_ns=T0 + 1, gpu=3, uuid="GPU-3",
                                                **{**GPU_READINGS, "xid": 79})])
    assert "does not match" in _reason(_handler().handle(TOPIC, 0, 1, key, other_value, headers))


def test_without_a_producer_key_there_is_no_check() -> None:
    assert identity_check(NodeSigning(producer_key=None)) is None
    assert KafkaPublisher("127.0.0.1:1", node_key=b"").signed(TOPIC, b"k", b"v", []) == (b"k", b"v", [])


BAD_NODE_KEY = "not-hex-at-all-" + "q" * 49   # 64 characters, not hex


def test_a_malformed_node_key_is_a_clear_settings_error_that_hides_the_key(monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("CLOCKTOWER_NODE_KEY", BAD_NODE_KEY)
    with pytest.raises(ValidationError) as raised:
        KafkaPublisher("127.0.0.1:1")   # reads CLOCKTOWER_NODE_KEY when built
    assert "CLOCKTOWER_NODE_KEY must be 64 hex characters" in str(raised.value)
    assert BAD_NODE_KEY not in str(raised.value) and "qqqq" not in str(raised.value)
    for bad in ("ab" * 16, "", "0x" + "ab" * 31):
        with pytest.raises(ValidationError, match="must be 64 hex characters"):
            NodeSigning(node_key=bad)
    good = node_key(PRODUCER_KEY, "node-1")
    assert NodeSigning(node_key=good.hex() + "\n").node_key_bytes() == good   # a trailing newline from a file


def test_an_empty_or_short_producer_key_is_refused_not_silently_off() -> None:
    for bad in ("", "p" * 31):
        with pytest.raises(ValidationError, match="at least 32 characters") as raised:
            NodeSigning(producer_key=bad)
        assert "p" * 31 not in str(raised.value)
    assert NodeSigning(producer_key=PRODUCER_KEY.decode()).producer_key_bytes() == PRODUCER_KEY


def test_the_agent_reports_a_malformed_node_key_in_one_line(tmp_path) -> None:  # noqa: ANN001
    from tests.test_cli import _env, assert_one_error_line, clocktower

    r = clocktower("agent", "--duration", "0.5", "--sources", "links", "--kafka", "127.0.0.1:1",
                   "--spool-dir", str(tmp_path / "spool"), env=_env(CLOCKTOWER_NODE_KEY=BAD_NODE_KEY))
    line = assert_one_error_line(r, "node_key", "CLOCKTOWER_NODE_KEY must be 64 hex characters")
    assert "qqqq" not in line


def test_the_streams_check_identity_on_what_nodes_publish_not_on_what_they_read_back() -> None:
    """Clock edge fits and regrouped records are the streams' own: nodes do not sign them, so a producer key must
    not turn the clock solve or the joins off."""
    from clocktower.control.issuer import CommandIssuer
    from clocktower.streams.processor_context import ProcessorContext
    from clocktower.streams.registry import build
    from clocktower.streams.remediation_budget import RemediationBudget
    from clocktower.streams.topology import Topology, record_handlers

    check = identity_check(NodeSigning(producer_key=PRODUCER_KEY.decode()))
    topology = Topology(build(ProcessorContext()), CommandIssuer(TEST_SIGNER), RemediationBudget(), lambda p: None)
    handlers = record_handlers(topology, check, 10**9)
    assert handlers["telemetry.gpu"].identity is check and handlers["telemetry.clock"].identity is check
    assert handlers["analytics.clock_edges"].identity is None
    assert handlers["control.acks"].identity is check          # an applied undrain frees a spare: the node's word
    assert handlers["control.replacements"].identity is check  # the streams sign these in the node's name
    assert handlers["control.ticks"].identity is check         # ... and their ticks in the worker's
    assert topology.repartition_topics and all(handlers[t].identity is None and handlers[t].internal
                                               for t in topology.repartition_topics)


def test_an_unsigned_undrain_ack_frees_no_spare() -> None:
    """Anyone who can write control.acks could otherwise free the spare that replaces any node."""
    ack = ControlAck(node="node-1", ts_ns=T0, command_id="c-1", status="applied", action="undrain", target="node-1")
    out = _handler().handle("control.acks", 0, 1, *encode_batch([ack]))
    assert "identity: record is not signed" in _reason(out)
    pub = KafkaPublisher("127.0.0.1:1", node_key=node_key(PRODUCER_KEY, "node-1"))
    assert _handler().handle("control.acks", 0, 2, *pub.signed("control.acks", *encode_batch([ack]))) == []


def _topology_handlers() -> dict:
    """The Faust app's handlers (streams/topology.py) over in-memory tables, with the producer key set."""
    from clocktower.control.issuer import CommandIssuer
    from clocktower.streams.processor_context import ProcessorContext
    from clocktower.streams.registry import build
    from clocktower.streams.remediation_budget import RemediationBudget
    from clocktower.streams.topology import Topology, record_handlers

    signing = NodeSigning(producer_key=PRODUCER_KEY.decode())
    tables: dict[str, dict] = {}
    budget = RemediationBudget(clock_ns=lambda: T0)   # the worker's wall clock: at the events' time
    topology = Topology(build(ProcessorContext(remediation_budget=budget, known_after_ns=0)),
                        CommandIssuer(TEST_SIGNER, clock_ns=budget.clock_ns), budget,
                        lambda p: tables.setdefault(p.name, {}))
    return record_handlers(topology, identity_check(signing), 10**9, output_signer(signing))


def test_the_streams_sign_the_replacement_requests_they_read_back_and_refuse_forged_ones() -> None:
    """Before: anyone who could write control.replacements got a node drained; now only what the streams signed
    in the faulty node's name (with the producer key) is acted on."""
    handlers = _topology_handlers()
    pub = KafkaPublisher("127.0.0.1:1", node_key=node_key(PRODUCER_KEY, "node-1"))
    asked = [o for o in handlers[TOPIC].handle(TOPIC, 0, 1, *pub.signed(TOPIC, *_xid79("node-1")))
             if o.topic == "control.replacements"]
    assert len(asked) == 1 and any(h == H_NODE_MAC for h, _ in asked[0].headers)
    replacements = handlers["control.replacements"]
    assert _actions(replacements.handle("control.replacements", 0, 1, asked[0].key, asked[0].value,
                                        asked[0].headers)) == ["drain"]
    forged = ReplacementRequest(node="node-2", ts_ns=T0, incident_id="i-2", reason="gpu_lost", gpu=0)
    out = replacements.handle("control.replacements", 0, 2, *encode_batch([forged]))
    assert "identity: record is not signed" in _reason(out)


def test_a_producer_key_file_must_be_private_and_long_enough(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    """CLOCKTOWER_PRODUCER_KEY_FILE (what `up` and `demo` name to their workers): this user's, 0600, no symlink."""
    import os

    for var in ("CLOCKTOWER_PRODUCER_KEY", "CLOCKTOWER_PRODUCER_KEY_FILE"):
        monkeypatch.delenv(var, raising=False)
    good = tmp_path / "producer.key"
    good.write_text("k" * 64 + "\n")
    good.chmod(0o600)
    assert NodeSigning(producer_key_file=good).producer_key_bytes() == b"k" * 64
    good.chmod(0o640)
    with pytest.raises(ValidationError, match="no one else can read or write"):
        NodeSigning(producer_key_file=good)
    good.chmod(0o600)
    link = tmp_path / "link.key"
    os.symlink(good, link)
    with pytest.raises(ValidationError, match="cannot open it"):
        NodeSigning(producer_key_file=link)
    short = tmp_path / "short.key"
    short.write_text("k" * 8)
    short.chmod(0o600)
    with pytest.raises(ValidationError, match="at least 32 characters") as raised:
        NodeSigning(producer_key_file=short)
    assert "kkkkkkkk" not in str(raised.value)
    monkeypatch.setenv("CLOCKTOWER_PRODUCER_KEY_FILE", str(good))
    assert NodeSigning().producer_key_bytes() == b"k" * 64


def test_a_fleet_publisher_signs_each_record_with_its_nodes_key() -> None:
    """The demo's simulated fleet publishes for many nodes: each record carries the MAC of the node it is keyed by."""
    from clocktower.schemas.record_mac import check

    publisher = KafkaPublisher("127.0.0.1:9", producer_key=PRODUCER_KEY)
    publisher.node_key = None   # as on a host without CLOCKTOWER_NODE_KEY
    try:
        signed = {node: publisher.signed(TOPIC, *_xid79(node)) for node in ("node-1", "node-2")}
        for key, value, headers in signed.values():
            assert check(PRODUCER_KEY, TOPIC, key, value, headers) is None
        key, value, _ = signed["node-1"]
        assert check(PRODUCER_KEY, TOPIC, key, value, signed["node-2"][2]) is not None   # not node-2's MAC
    finally:
        publisher.producer.flush(0)


def test_a_publisher_beside_up_signs_with_ups_key_and_one_elsewhere_does_not(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    """A training script's Telemetry, the clock CLI or `clocktower agent` beside `up` (a broker on this host, `up`'s
    data dir) sign with the key derived from `up`'s producer key: `up`'s streams dead-letter unsigned records."""
    from clocktower.generated_secrets import ensure_producer_key
    from clocktower.schemas.record_mac import check

    for var in ("CLOCKTOWER_PRODUCER_KEY", "CLOCKTOWER_PRODUCER_KEY_FILE", "CLOCKTOWER_NODE_KEY"):
        monkeypatch.delenv(var, raising=False)
    data_dir = tmp_path / "ct"
    data_dir.mkdir(mode=0o700)
    monkeypatch.setenv("CLOCKTOWER_DATA_DIR", str(data_dir))
    assert KafkaPublisher("127.0.0.1:9").producer_key is None        # no `up` has run here: nothing to sign with
    key_file = ensure_producer_key(data_dir)
    producer_key = NodeSigning(producer_key_file=key_file).producer_key_bytes()
    assert producer_key is not None
    for bootstrap, signs in (("127.0.0.1:9", True), ("localhost:9,[::1]:9", True), ("10.1.2.3:9092", False)):
        publisher = KafkaPublisher(bootstrap)
        assert publisher.producer_key == (producer_key if signs else None), bootstrap
        if signs:
            key, value, headers = publisher.signed(TOPIC, *_xid79("gpu-7"))
            assert check(producer_key, TOPIC, key, value, headers) is None
    key_file.chmod(0o644)                                            # unfit: named in a warning, not used
    assert KafkaPublisher("127.0.0.1:9").producer_key is None
    monkeypatch.setenv("CLOCKTOWER_NODE_KEY", node_key(producer_key, "gpu-7").hex())   # its own key comes first
    own = KafkaPublisher("127.0.0.1:9")
    assert own.producer_key is None and own.node_key == node_key(producer_key, "gpu-7")


def test_only_ticks_the_streams_signed_are_read_by_the_allocator() -> None:
    """A tick decides when the allocator re-checks withheld requests, which can decide between a grant and giving
    one up (issue 18 review): with the producer key, a tick nobody signed is dead-lettered, as a forged request."""
    handlers = _topology_handlers()
    ticks = handlers["control.ticks"]
    forged = StreamsTick(node="clocktower-streams-host-a", ts_ns=T0)
    assert "identity: record is not signed" in _reason(ticks.handle("control.ticks", 0, 1, *encode_batch([forged])))
    signer = output_signer(NodeSigning(producer_key=PRODUCER_KEY.decode()))
    assert signer is not None
    [out] = [signer(o) for o in records([forged])]    # as the worker's timer signs its own (engine/faust_worker.py)
    assert isinstance(out, Out) and any(h == H_NODE_MAC for h, _ in out.headers)
    assert ticks.handle("control.ticks", 0, 2, out.key, out.value, out.headers) == []   # read: nothing withheld
