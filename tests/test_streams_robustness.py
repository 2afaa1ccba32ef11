"""The streams survive any valid input: 256-character names give valid, bounded ids and events."""

from __future__ import annotations

from schemas.analytics import Incident
from schemas.control import ControlCommand
from schemas.telemetry import GpuHealth, LinkState
from streams.command_signing import CommandIssuer, verify
from streams.gpu_fault_detector import GpuFaultDetector
from streams.ids import bounded_name, stable_id
from streams.link_flap_detector import LinkFlapDetector

T0 = 1_780_000_000 * 10**9
KEY = b"k" * 32
S = 10**9
NODE = "n" * 256          # the longest node name the schema allows
IFACE = "i" * 256         # and the longest interface name


def _revalidate(events: list) -> None:
    """Every derived event must pass its own model's validation (as the sink and codec will check)."""
    for e in events:
        type(e).model_validate(e.model_dump())


def test_xid79_from_a_256_char_node_drains_and_brings_a_spare() -> None:
    d = GpuFaultDetector(CommandIssuer(KEY))
    out = d.on_gpu_health(GpuHealth(node=NODE, ts_ns=T0, gpu=7, uuid="GPU-7", xid=79))
    _revalidate(out)
    inc = next(e for e in out if isinstance(e, Incident))
    cmds = [e for e in out if isinstance(e, ControlCommand)]
    assert inc.kind == "gpu_xid" and len(inc.incident_id) <= 256 and len(inc.target) <= 256
    assert [c.action for c in cmds] == ["drain", "spare"] and all(verify(c, KEY) for c in cmds)
    assert all(c.incident_id == inc.incident_id for c in cmds)


def test_link_flaps_on_256_char_names_open_and_resolve() -> None:
    d = LinkFlapDetector(CommandIssuer(KEY), window_ns=10 * S, min_transitions=3, stable_ns=5 * S)
    out = []
    for i, up in enumerate([True, False, True, False, True]):
        out += d.on_link_state(LinkState(node=NODE, ts_ns=T0 + i * S, interface=IFACE, kind="ethernet", up=up,
                                         carrier_changes=i))
    out += d.on_link_state(LinkState(node=NODE, ts_ns=T0 + 20 * S, interface=IFACE, kind="ethernet", up=True,
                                     carrier_changes=4))
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
