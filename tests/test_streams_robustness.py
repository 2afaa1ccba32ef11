"""The streams survive any valid input: 256-character names give valid, bounded ids and events."""

from __future__ import annotations

from prometheus_client import REGISTRY

from clocktower.control.intent import CommandIntent
from clocktower.control.issuer import CommandIssuer
from clocktower.schemas.analytics import Incident
from clocktower.schemas.codec import decode_batch, encode_batch
from clocktower.schemas.control import ControlCommand, ReplacementRequest
from clocktower.schemas.ids import bounded_name, stable_id
from clocktower.schemas.operations import DeadLetter
from clocktower.schemas.telemetry import FlowSample, GpuHealth, LinkState
from clocktower.streams.detectors.gpu_fault import GpuFaultDetector
from clocktower.streams.detectors.link_flap import LinkFlapDetector
from clocktower.streams.detectors.replacement_allocator import ReplacementAllocator
from clocktower.streams.joins.flow_latency import FlowLatencyJoin
from clocktower.streams.processor import Processor
from clocktower.streams.processors import Processors
from clocktower.streams.record_handler import RecordHandler
from clocktower.streams.remediation_budget import RemediationBudget
from clocktower.streams.state_store import StateStore
from tests.control_keys import TEST_SIGNER, TEST_VERIFIER
from tests.event_samples import GPU_READINGS, SAMPLES

T0 = 1_780_000_000 * 10**9
KEY = TEST_SIGNER
S = 10**9
NODE = "n" * 256          # the longest node name the schema allows
IFACE = "i" * 256         # and the longest interface name


def _revalidate(events: list) -> None:
    """Every derived event must pass its own model's validation (as the sink and codec will check)."""
    for e in events:
        type(e).model_validate(e.model_dump())


class _Fed:
    """A detector fed one event at a time (a batch each), returning its unsigned outputs."""

    def __init__(self, proc: Processor) -> None:
        self.proc, self.store = proc, StateStore(proc)

    def __call__(self, e: GpuHealth | LinkState) -> list:
        out = self.proc.process(self.store, e)
        self.store.flush()
        return out


class _Replacing:
    """The GPU detector and the fleet's allocator, each fed one event at a time: what the pipeline does."""

    def __init__(self, budget: RemediationBudget, spares: tuple[str, ...] = ()) -> None:
        self.gpus = _Fed(GpuFaultDetector())
        self.allocator = _Fed(ReplacementAllocator(budget=budget, spare_nodes=spares))

    def __call__(self, e: GpuHealth) -> list:
        out = self.gpus(e)
        return out + [o for r in out if isinstance(r, ReplacementRequest) for o in self.allocator(r)]


def _with_spares(processors: Processors, spares: tuple[str, ...]) -> Processors:
    processors.replace(ReplacementAllocator(budget=processors.budget, spare_nodes=spares))
    return processors


def test_xid79_from_a_256_char_node_drains_and_brings_a_spare() -> None:
    pipeline = _with_spares(Processors(KEY, clock_ns=lambda: T0, known_after_ns=0), ("spare-1",))
    out = pipeline.on_batch([GpuHealth(node=NODE, ts_ns=T0, gpu=7, uuid="GPU-7", **{**GPU_READINGS, "xid": 79})])
    _revalidate(out)
    inc = next(e for e in out if isinstance(e, Incident))
    cmds = [e for e in out if isinstance(e, ControlCommand)]
    assert inc.kind == "gpu_xid" and len(inc.incident_id) <= 256 and len(inc.target) <= 256
    assert [c.action for c in cmds] == ["drain", "spare"] and all(TEST_VERIFIER.verify(c) for c in cmds)
    assert all(c.incident_id == inc.incident_id for c in cmds)


def test_link_flaps_on_256_char_names_open_and_resolve() -> None:
    d = _Fed(LinkFlapDetector(window_ns=10 * S, min_transitions=3, stable_ns=5 * S, watchdog_ns=10 * S))
    intents = []
    for i, up in enumerate([True, False, True, False, True]):
        intents += d(LinkState(node=NODE, ts_ns=T0 + i * S, interface=IFACE, kind="ethernet", up=up,
                               carrier_changes=i, speed_mbps=0, operstate="up", carrier=up, backup="b" * 256))
    intents += d(LinkState(node=NODE, ts_ns=T0 + 20 * S, interface=IFACE, kind="ethernet", up=True,
                           carrier_changes=4, speed_mbps=0, operstate="up", carrier=True, backup="b" * 256))
    out = CommandIssuer(KEY).signed(intents)
    _revalidate(out)
    states = [(type(e).__name__, getattr(e, "state", getattr(e, "action", ""))) for e in out]
    assert states == [("Incident", "open"), ("ControlCommand", "failover"),
                      ("Incident", "resolve"), ("ControlCommand", "restore")]


def test_ids_are_bounded_deterministic_and_distinct() -> None:
    a = stable_id("gpu_xid", NODE, "gpu0", T0)
    assert a == stable_id("gpu_xid", NODE, "gpu0", T0) and len(a) <= 256 and a.startswith("gpu_xid:nnnn")
    assert a != stable_id("gpu_xid", NODE, "gpu1", T0)
    assert stable_id("x", "a:b", "c") != stable_id("x", "a", "b:c")   # no ambiguity from the separator
    assert bounded_name("short") == "short"
    long1, long2 = bounded_name(NODE + "/gpu0"), bounded_name(NODE + "/gpu1")
    assert len(long1) == 256 and long1 != long2


def _xid79(node: str, ts: int) -> GpuHealth:
    return GpuHealth(node=node, ts_ns=ts, gpu=0, uuid="GPU-0", **{**GPU_READINGS, "xid": 79})


class _Clock:
    """The worker's processing clock, moved by hand."""

    def __init__(self) -> None:
        self.now_ns = 5 * S

    def __call__(self) -> int:
        return self.now_ns


def test_remediation_budget_holds_excess_drains_for_a_human() -> None:
    clock = _Clock()
    budget = RemediationBudget(max_per_window=2, window_ns=3600 * S, clock_ns=clock)
    d = _Replacing(budget, ("spare-1", "spare-2", "spare-3"))
    actions = []
    for i in range(4):   # four nodes lose a GPU within ten minutes: only two are replaced
        clock.now_ns += 150 * S
        out = d(_xid79(f"node-{i}", T0 + i * 150 * S))
        actions.append([e.action for e in out if isinstance(e, CommandIntent)])
        assert any(isinstance(e, Incident) for e in out), "the incident is still reported"
    assert actions == [["drain", "spare"], ["drain", "spare"], [], []]
    assert budget.withheld == 2 and "withheld: the fleet limit" in out[-1].detail
    # An hour (of the worker's clock) after the first, the budget has room again.
    clock.now_ns += 3600 * S - 3 * 150 * S
    out = d(_xid79("node-9", T0 + 3600 * S))
    assert [e.action for e in out if isinstance(e, CommandIntent)] == ["drain", "spare"]


def _replaced(out: list) -> int:
    """Drains asked for: intents from a detector, or signed commands from a handler."""
    return sum(1 for e in out if isinstance(e, (ControlCommand, CommandIntent)) and e.action == "drain")


def _published(out: list) -> list:
    """The events in a handler's output records, decoded as a consumer would."""
    return [e for t, k, v, h, _ in out for e in decode_batch(t, k, v, h).events]


def test_forged_event_times_an_hour_apart_do_not_refill_the_budget() -> None:
    """Ten XID 79s for ten nodes, stamped t + i hours but processed at once: two replacements, not ten."""
    budget = RemediationBudget(max_per_window=2, window_ns=3600 * S, clock_ns=_Clock())
    handler = RecordHandler(Processors(KEY, remediation_budget=budget, known_after_ns=0))
    pairs = 0
    for i in range(10):
        k, v, h = encode_batch([_xid79(f"node-{i}", T0 + i * 3600 * S)])
        out = handler.handle("telemetry.gpu", 0, i, k, v, h)
        pairs += _replaced(_published(out))
    assert pairs == 2 and budget.withheld == 8


def test_an_event_dated_in_the_future_does_not_block_real_faults_later() -> None:
    clock = _Clock()
    budget = RemediationBudget(max_per_window=1, window_ns=3600 * S, clock_ns=clock)
    d = _Replacing(budget)
    assert _replaced(d(_xid79("forged", T0 + 10 * 365 * 24 * 3600 * S))) == 1   # dated 10 years on
    clock.now_ns += 3600 * S   # an hour of real time later, a real fault is replaced
    assert _replaced(d(_xid79("real", T0 + 3600 * S))) == 1


def test_remediation_budget_window_slides_on_processing_time_only() -> None:
    clock = _Clock()
    b = RemediationBudget(max_per_window=1, window_ns=10 * S, clock_ns=clock)
    granted: list[int] = []
    assert b.allow(granted)
    clock.now_ns += 9 * S
    assert not b.allow(granted)
    clock.now_ns += 1 * S
    assert b.allow(granted) and b.withheld == 1 and granted == [clock.now_ns]


class _Exploding(Processors):
    """Processors whose GPU detector raises on one node: a bug no input should be able to trigger."""

    def route(self, topic, partition, events, failures, offset=None):  # noqa: ANN001, ANN201
        if events and events[0].node == "boom":
            raise RuntimeError("detector bug " + "x" * 100_000)
        return super().route(topic, partition, events, failures, offset)


def test_a_batch_that_raises_is_dead_lettered_and_the_next_one_processed() -> None:
    handler = RecordHandler(_Exploding(KEY, clock_ns=lambda: T0, known_after_ns=0))
    before = REGISTRY.get_sample_value("clocktower_streams_batch_failures_total", {"topic": "telemetry.gpu"}) or 0
    k, v, h = encode_batch([_xid79("boom", T0)])
    out = handler.handle("telemetry.gpu", 1, 41, k, v, h)
    assert [t for t, *_ in out] == ["deadletter"]
    dl = decode_batch("deadletter", out[0][1], out[0][2], out[0][3]).events[0]
    assert dl.detector == "streams" and dl.origin_topic == "telemetry.gpu" and dl.origin_offset == 41
    assert dl.reason.startswith("streams error: RuntimeError: detector bug") and len(dl.reason) <= 65536
    after = REGISTRY.get_sample_value("clocktower_streams_batch_failures_total", {"topic": "telemetry.gpu"})
    assert after == before + 1
    k, v, h = encode_batch([_xid79("node-1", T0 + S)])
    topics = sorted(t for t, *_ in handler.handle("telemetry.gpu", 1, 42, k, v, h))
    assert topics == ["analytics.incidents", "control.commands", "control.replacements"]


def test_decode_failures_are_counted() -> None:
    handler = RecordHandler(Processors(KEY, clock_ns=lambda: T0, known_after_ns=0))
    before = REGISTRY.get_sample_value("clocktower_streams_decode_failures_total", {"topic": "telemetry.gpu"}) or 0
    assert handler.handle("telemetry.gpu", 0, 1, b"n", b"not json", [("ct-schema", b"gpu_health")]) == []
    after = REGISTRY.get_sample_value("clocktower_streams_decode_failures_total", {"topic": "telemetry.gpu"})
    assert after == before + 1


class _GpuBug(GpuFaultDetector):
    """A GPU detector with a bug that GPU 1's readings trigger."""

    def process(self, state, ev) -> list:  # noqa: ANN001
        if ev.gpu == 1:
            raise ValueError("detector bug on gpu 1 " + "y" * 100_000)
        return super().process(state, ev)


def test_one_failing_event_keeps_the_batchs_other_outputs_and_dead_letters_once() -> None:
    processors = _with_spares(Processors(KEY, clock_ns=lambda: T0, known_after_ns=0), ("spare-1",))
    processors.replace(_GpuBug())
    handler = RecordHandler(processors)
    before = REGISTRY.get_sample_value("clocktower_streams_batch_failures_total", {"topic": "telemetry.gpu"}) or 0
    batch = [GpuHealth(node="node-1", ts_ns=T0, gpu=0, uuid="GPU-0", **{**GPU_READINGS, "xid": 79}),
             GpuHealth(node="node-1", ts_ns=T0 + 1, gpu=1, uuid="GPU-1", **{**GPU_READINGS, "xid": 79}),
             GpuHealth(node="node-1", ts_ns=T0 + 2, gpu=2, uuid="GPU-2",
                       **{**GPU_READINGS, "xid": 74})]
    k, v, h = encode_batch(batch)
    out = handler.handle("telemetry.gpu", 3, 77, k, v, h)
    events = _published(out)
    incidents = sorted((e.target, e.kind, e.state) for e in events if isinstance(e, Incident))
    assert incidents == [("node-1/gpu0", "gpu_xid", "open"), ("node-1/gpu0", "gpu_xid", "update"),   # the allocator's
                         ("node-1/gpu2", "gpu_xid", "open")]
    assert sorted(e.action for e in events if isinstance(e, ControlCommand)) == ["drain", "spare"]
    dead = [e for e in events if isinstance(e, DeadLetter)]
    assert [t for t, *_ in out].count("deadletter") == 1
    assert len(dead) == 1 and dead[0].detector == "streams" and dead[0].origin_offset == 77
    assert dead[0].reason.startswith("streams error: 1 of 3 events failed (#1); first: ValueError: detector bug")
    assert len(dead[0].reason) <= 1200
    after = REGISTRY.get_sample_value("clocktower_streams_batch_failures_total", {"topic": "telemetry.gpu"})
    assert after == before + 1
    # The NVLink incident opened in that batch resolves later (a quiet minute): its open was published, so the
    # resolve refers to it.
    k, v, h = encode_batch([GpuHealth(node="node-1", ts_ns=T0 + 61 * S, gpu=2, uuid="GPU-2",
                                       **{**GPU_READINGS, "temperature_c": 60})])
    resolved = [e for e in _published(handler.handle("telemetry.gpu", 3, 78, k, v, h)) if isinstance(e, Incident)]
    opened = next(e for e in events if isinstance(e, Incident) and e.target == "node-1/gpu2")
    assert [(e.state, e.incident_id) for e in resolved] == [("resolve", opened.incident_id)]


def test_without_a_failures_list_the_first_error_propagates() -> None:
    processors = Processors(KEY)
    processors.replace(_GpuBug())
    try:
        processors.on_batch([GpuHealth(node="n", ts_ns=T0, gpu=1, uuid="GPU-1", **GPU_READINGS)])
    except ValueError as exc:
        assert "detector bug" in str(exc)
    else:
        raise AssertionError("the error was swallowed")


class _FlowBug(FlowLatencyJoin):
    """A flow join with a bug that sequence number 13 triggers: it runs behind its repartition topic."""

    def process(self, state, ev) -> list:  # noqa: ANN001
        if ev.seq == 13:
            raise ValueError("join bug on seq 13")
        return super().process(state, ev)


def test_a_regrouped_event_that_fails_is_named_by_its_index_in_the_input_record() -> None:
    """In memory, a flow sample fails behind the flow join's repartition topic: the dead letter of the input record
    names it as that record's event #5, as the processors' own failures are named."""
    processors = Processors(KEY, clock_ns=lambda: T0, known_after_ns=0)
    processors.replace(_FlowBug())
    base = SAMPLES["flow_sample"]
    batch = [FlowSample(**{**base, "node": "node-1", "ts_ns": T0 + s, "seq": 8 + s, "src_port": 40000 + s})
             for s in range(8)]
    k, v, h = encode_batch(batch)
    out = RecordHandler(processors).handle("telemetry.flows", 2, 91, k, v, h)
    dead = [e for e in _published(out) if isinstance(e, DeadLetter)]
    assert len(dead) == 1 and dead[0].origin_offset == 91
    assert dead[0].reason.startswith("streams error: 1 of 8 events failed (#5); first: ValueError: join bug")
