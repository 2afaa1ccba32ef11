"""Control signing lives in control/: detectors return intents, the streams' edge signs them, actuators verify.

The pinned ids and signatures were produced by the old in-detector signing (streams/command_signing.py,
before the move) for the same inputs: the move must not change one byte of a command.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from clocktower.control.intent import CommandIntent
from clocktower.control.issuer import CommandIssuer
from clocktower.control.signing import verify
from clocktower.schemas.analytics import Incident
from clocktower.schemas.control import ControlCommand
from clocktower.schemas.telemetry import GpuHealth, LinkState
from clocktower.streams.detectors.gpu_fault import GpuFaultDetector
from clocktower.streams.detectors.link_flap import LinkFlapDetector
from clocktower.streams.processors import Processors
from clocktower.streams.state_store import StateStore
from tests.event_samples import GPU_READINGS

T0 = 1_780_000_000 * 10**9
S = 10**9
KEY = b"k" * 32
CONTROL = Path(__file__).resolve().parents[1] / "control"

# (action, command_id, expires_ns, signature) from the old signing, for _events() under KEY.
BEFORE_THE_MOVE = [
    ("failover", "failover:link_flap:node-1:ac02cbd1bebcf48d1962a6de0ed7843d:81293a600758e1dbcaa902fdb45b5654",
     1780000063000000000, "d0aad7b16380e3a34aaa8d8c27b8360faed25e2a32a2d5064fa5b720e23d1929"),
    ("restore", "restore:link_flap:node-1:ac02cbd1bebcf48d1962a6de0ed7843d:cddc33f2ab97dc967c16f65d0daf76f2",
     1780000075000000000, "7016566b53284acf8f6ddab10b6deb885ff20d4d7cc3662c234bf923b433930e"),
    ("drain", "drain:gpu_xid:node-3:91d84c6055a0ed96694d8804b49252d8:3ffb48159fb2e7f44fd0c8d5b653aefd",
     1780000061000000000, "b7665c082411093f11c7e5fde93e100dc82709df17b39d3f980bd962c90aaacf"),
    ("spare", "spare:gpu_xid:node-3:91d84c6055a0ed96694d8804b49252d8:1ecb4fdb0d994fdbb845f8974b67dacf",
     1780000061000000000, "31d43b05fe034c27469e9c01da17a7d968ee9df5eea1cd8fc3fd64e89394d0c3"),
]


def _link(ts: int, up: bool, changes: int) -> LinkState:
    return LinkState(node="node-1", ts_ns=ts, interface="eth0", kind="ethernet", up=up, carrier_changes=changes,
                     speed_mbps=0, operstate="up" if up else "down", carrier=up)


def _gpu(ts: int, **kw: object) -> GpuHealth:
    return GpuHealth(node="node-3", ts_ns=ts, gpu=5, uuid="GPU-x", **{**GPU_READINGS, **kw})


def _events() -> list[LinkState | GpuHealth]:
    """A link flap that opens and resolves (failover, restore), then a GPU that falls off the bus (drain, spare)."""
    return [_link(T0, True, 0), _link(T0 + S, False, 1), _link(T0 + 2 * S, True, 2), _link(T0 + 3 * S, False, 3),
            _link(T0 + 9 * S, True, 4), _link(T0 + 15 * S, True, 4), _gpu(T0), _gpu(T0 + S, xid=79)]


def test_edge_signing_gives_the_commands_of_before_the_move() -> None:
    out: list = []
    processors = Processors(KEY)
    for e in _events():
        out += processors.on_batch([e])
    cmds = [e for e in out if isinstance(e, ControlCommand)]
    assert [(c.action, c.command_id, c.expires_ns, c.signature) for c in cmds] == BEFORE_THE_MOVE
    assert all(verify(c, KEY) for c in cmds) and not any(verify(c, b"other-key") for c in cmds)
    assert not any(isinstance(e, CommandIntent) for e in out), "no intent leaves the streams unsigned"
    incidents = [e.incident_id for e in out if isinstance(e, Incident)]
    # Each command stays attached to its incident: failover/restore to the flap, drain/spare to the XID.
    assert [c.incident_id for c in cmds] == [incidents[0], incidents[0], incidents[2], incidents[2]]


def test_detectors_hold_no_key_and_return_intents_the_issuer_signs_alike() -> None:
    links, gpus = LinkFlapDetector(), GpuFaultDetector()
    stores = {links: StateStore(links), gpus: StateStore(gpus)}
    intents: list = []
    for e in _events():
        det = links if isinstance(e, LinkState) else gpus
        intents += det.process(stores[det], e)
        stores[det].flush()
    assert [i.action for i in intents if isinstance(i, CommandIntent)] == ["failover", "restore", "drain", "spare"]
    assert not any(isinstance(e, ControlCommand) for e in intents)
    signed = [c for c in CommandIssuer(KEY).signed(intents) if isinstance(c, ControlCommand)]
    assert [(c.action, c.command_id, c.expires_ns, c.signature) for c in signed] == BEFORE_THE_MOVE


def test_signature_covers_every_field() -> None:
    cmd = CommandIssuer(KEY).issue(CommandIntent("node-1", "failover", "eth0", T0, "inc", {"to": "eth1"}))
    assert verify(cmd, KEY)
    for change in ({"node": "node-2"}, {"params": {"to": "eth9"}}, {"expires_ns": cmd.expires_ns + 1},
                   {"incident_id": "other"}, {"command_id": "replayed"}):
        assert not verify(cmd.model_copy(update=change), KEY)


def test_an_empty_key_is_refused() -> None:
    with pytest.raises(ValueError, match="empty"):
        CommandIssuer(b"")


def test_control_imports_only_schemas_and_libraries() -> None:
    """The actuators import control/; it must not pull in the stream processors, sinks, producers or the CLI."""
    offenders = []
    for path in CONTROL.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{path.name}: {n}" for n in names if n.startswith("clocktower")
                          and not n.startswith(("clocktower.schemas", "clocktower.control"))]
    assert offenders == []
