"""Security against real routes: in a network namespace, every kind of bad command is refused with a `refused` ack
carrying the reason, and the kernel's routing table is exactly as it was; the genuine command then moves the route."""

from __future__ import annotations

import os
import time
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from clocktower.actuators.actuator import Actuator
from clocktower.actuators.hooks import Hooks
from clocktower.actuators.quarantine import Quarantine
from clocktower.actuators.seen_commands import SeenCommands
from clocktower.control.command_check import MAX_LIFETIME_NS
from clocktower.control.intent import CommandIntent
from clocktower.control.issuer import CommandIssuer
from clocktower.control.signing import CommandSigner
from clocktower.schemas.control import ControlCommand
from tests.control_keys import TEST_SIGNER, TEST_VERIFIER, resigned
from tests.netns import namespace_with_veth

NODE = "node-a"
S = 10**9
DST = "10.99.0.0"


def _cmd(node: str = NODE, ts_ns: int | None = None, signer: CommandSigner = TEST_SIGNER, ttl_ns: int = 60 * S,
         action: str = "failover", link: str = "pri", backup: str = "bkp") -> ControlCommand:
    ts = time.time_ns() if ts_ns is None else ts_ns
    params = {"from": link, "to": backup} if action == "failover" else {"from": backup, "to": link}
    return CommandIssuer(signer, ttl_ns, clock_ns=lambda: ts).issue(   # issued at its event time
        CommandIntent(node, action, link, ts, "inc-1", params))  # type: ignore[arg-type]


def _routes(ip, dev: dict[int, str]) -> list[tuple]:  # noqa: ANN001
    return sorted((m.get("dst"), m["dst_len"], dev.get(m.get("oif"), "?"), m["proto"], m.get("priority"))
                  for m in ip.route("dump", family=2) if m.get("table") == 254)


def test_bad_commands_leave_the_kernel_routes_unchanged(tmp_path: Path) -> None:
    from pyroute2 import IPRoute

    from clocktower.actuators.route_table import KernelRouting
    ns = f"ctact-{os.getpid() % 100000}"
    with namespace_with_veth(ns, "pri", "bkp"), IPRoute(netns=ns, flags=0) as ip:
        dev = {ip.link_lookup(ifname=n)[0]: n for n in ("pri", "bkp")}
        ip.route("add", dst=f"{DST}/24", oif=ip.link_lookup(ifname="pri")[0], proto=4)
        before = _routes(ip, dev)
        assert (DST, 24, "pri", 4, None) in before
        with KernelRouting(tmp_path / "routes.json", netns=ns) as routing:
            state = tmp_path / "state"
            act = Actuator(NODE, TEST_VERIFIER, routing, SeenCommands(state), Quarantine(state), Hooks({}),
                           backups={"pri": "bkp"}.get)
            genuine = _cmd()
            bad = {
                "unsigned": genuine.model_copy(update={"signature": "-"}),
                "forged": _cmd(signer=CommandSigner(Ed25519PrivateKey.generate())),
                "altered": genuine.model_copy(update={"params": {"from": "pri", "to": "lo"}}),
                "wrong node": _cmd(node="node-b"),
                "expired": _cmd(ts_ns=time.time_ns() - 120 * S),
                "too long-lived": resigned(
                    _cmd().model_copy(update={"expires_ns": time.time_ns() + MAX_LIFETIME_NS + S})),
            }
            for kind, cmd in bad.items():
                ack = act.handle(cmd)
                assert ack.status == "refused" and ack.detail, (kind, ack)
                assert _routes(ip, dev) == before, f"{kind}: the routes changed"
            ack = act.handle(genuine)
            assert ack.status == "applied", ack
            moved = _routes(ip, dev)
            assert any(r[0] == DST and r[2] == "bkp" for r in moved) and not any(
                r[0] == DST and r[2] == "pri" for r in moved), moved
            replay = act.handle(genuine)
            assert replay.status == "refused" and "replayed" in replay.detail
            forged_restore = _cmd(action="restore", signer=CommandSigner(Ed25519PrivateKey.generate()))
            assert act.handle(forged_restore).status == "refused"
            assert _routes(ip, dev) == moved, "a refused restore leaves the route on the backup"
            assert act.handle(_cmd(action="restore", ts_ns=time.time_ns() + 1)).status == "applied"
            assert _routes(ip, dev) == before
            act.close()
