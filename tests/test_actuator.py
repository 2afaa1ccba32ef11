"""The actuator: every kind of bad command is refused with the node unchanged; good ones are applied, idempotently.

The routing is a recording fake over the in-memory backend, so "unchanged" means: not called at all.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from clocktower.actuators.actuator import Actuator
from clocktower.actuators.hooks import Hooks
from clocktower.actuators.link_routing import LinkRouting, RoutingError
from clocktower.actuators.quarantine import Quarantine
from clocktower.actuators.seen_commands import SeenCommands
from clocktower.actuators.simulated_routing import SimulatedRouting
from clocktower.control.command_check import MAX_LIFETIME_NS
from clocktower.control.intent import CommandIntent
from clocktower.control.issuer import CommandIssuer
from clocktower.control.signing import CommandSigner
from clocktower.schemas.control import ControlCommand
from tests.control_keys import TEST_SIGNER, TEST_VERIFIER, resigned

T0 = 1_780_000_000 * 10**9
S = 10**9
NODE = "node-a"
OWN_BACKUPS = {"eth0": "eth1"}   # the node's own topology: the backup a command names is checked against it


class RecordingRouting:
    """A LinkRouting that records every call and forwards it to the in-memory backend."""

    def __init__(self) -> None:
        self.sim = SimulatedRouting()
        self.calls: list[tuple[str, str, str]] = []

    def remember(self, link: str, backup: str) -> str:
        return self.sim.remember(link, backup)

    def fail_over(self, link: str, backup: str) -> str:
        self.calls.append(("fail_over", link, backup))
        return self.sim.fail_over(link, backup)

    def restore(self, link: str, backup: str) -> str:
        self.calls.append(("restore", link, backup))
        return self.sim.restore(link, backup)

    def on_backup(self, link: str) -> bool:
        return self.sim.on_backup(link)


class Clock:
    def __init__(self, now: int = T0 + S) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def _cmd(action: str = "failover", target: str = "eth0", params: dict[str, str] | None = None, node: str = NODE,
         ts_ns: int = T0, signer: CommandSigner = TEST_SIGNER, ttl_ns: int = 60 * S) -> ControlCommand:
    if params is None:
        params = {"from": target, "to": "eth1"} if action in ("failover", "quarantine") else {"from": "eth1",
                                                                                           "to": target}
    return CommandIssuer(signer, ttl_ns, clock_ns=lambda: ts_ns).issue(   # issued at its event time
        CommandIntent(node, action, target, ts_ns, "inc-1", params))  # type: ignore[arg-type]


def _actuator(state: Path, routing: RecordingRouting | None = None, clock: Clock | None = None,
              hooks: Hooks | None = None) -> Actuator:
    clock = clock or Clock()
    return Actuator(NODE, TEST_VERIFIER, routing or RecordingRouting(), SeenCommands(state, clock=clock),
                    Quarantine(state, clock=clock), hooks or Hooks({}), clock=clock, backups=OWN_BACKUPS.get)


@pytest.fixture
def routing() -> RecordingRouting:
    return RecordingRouting()


@pytest.fixture
def act(tmp_path: Path, routing: RecordingRouting) -> Actuator:
    return _actuator(tmp_path / "state", routing)


# -- refusals: the node is unchanged ----------------------------------------------------------------------------

def _forged() -> ControlCommand:
    return _cmd(signer=CommandSigner(Ed25519PrivateKey.generate()))


BAD = {
    "unsigned": (lambda: _cmd().model_copy(update={"signature": "-"}), "unsigned"),
    "forged": (_forged, "bad signature"),
    "altered": (lambda: _cmd().model_copy(update={"params": {"from": "eth0", "to": "eth9"}}), "bad signature"),
    "wrong node": (lambda: _cmd(node="node-b"), "scoped to node 'node-b'"),
    "expired": (lambda: _cmd(ts_ns=T0 - 120 * S), "expired"),
    "dated ahead": (lambda: _cmd(ts_ns=T0 + 20 * 3600 * S), "ahead of this node's clock"),   # issued then too
    "too long-lived": (lambda: resigned(_cmd().model_copy(update={"expires_ns": T0 + MAX_LIFETIME_NS + S})),
                       "more than the"),
}


@pytest.mark.parametrize("kind", BAD)
def test_a_bad_command_is_refused_and_the_node_is_unchanged(kind: str, act: Actuator,
                                                           routing: RecordingRouting) -> None:
    make, reason = BAD[kind]
    ack = act.handle(make())
    assert ack.status == "refused" and reason in ack.detail, ack
    assert routing.calls == [], "the routing was not touched"
    assert ack.node == NODE and ack.action == "failover" and ack.target == "eth0" and ack.apply_ns == 0
    assert len(act.seen) == 0, "a refused command is not remembered (a forged one cannot claim a genuine id)"


def test_a_flood_of_forged_commands_is_logged_in_a_few_lines(act: Actuator, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 18 finding 11: every one of 261k forged commands got its own WARNING line. Now at most a burst of
    REFUSAL_LINES_BURST (then REFUSAL_LINES_PER_S), and the rest are counted and named at powers of two."""
    from clocktower.actuators.actuator import REFUSAL_LINES_BURST

    forged = _forged()
    with caplog.at_level("WARNING", logger="clocktower.actuators.actuator"):
        acks = [act.handle(forged.model_copy(update={"command_id": f"forged-{i}"})) for i in range(2000)]
    assert all(a.status == "refused" and "bad signature" in a.detail for a in acks)   # every one still refused
    one_by_one = [r for r in caplog.records if r.getMessage().startswith("refused failover")]
    summaries = [r for r in caplog.records if "not logged one by one" in r.getMessage()]
    assert REFUSAL_LINES_BURST <= len(one_by_one) < REFUSAL_LINES_BURST + 20, len(one_by_one)   # act's clock is T0
    assert act.refusals_not_logged == 2000 - len(one_by_one)
    assert len(summaries) == act.refusals_not_logged.bit_length()   # 1, 2, 4, ... 1024
    with caplog.at_level("WARNING", logger="clocktower.actuators.actuator"):
        expired = act.handle(_cmd(ts_ns=T0 - 120 * S))               # a signed command's refusal: always logged
    assert expired.status == "refused" and any("expired" in r.getMessage() and expired.command_id in r.getMessage()
                                                for r in caplog.records)


def test_a_forged_command_does_not_block_the_genuine_one_with_its_id(act: Actuator, routing: RecordingRouting) -> None:
    genuine = _cmd()
    forged = _forged().model_copy(update={"command_id": genuine.command_id})
    assert act.handle(forged).status == "refused"
    assert act.handle(genuine).status == "applied"
    assert routing.calls == [("fail_over", "eth0", "eth1")]


def test_a_replay_is_refused_and_names_the_first_outcome(act: Actuator, routing: RecordingRouting) -> None:
    cmd = _cmd()
    assert act.handle(cmd).status == "applied"
    again = act.handle(cmd)
    assert again.status == "refused" and again.detail.startswith("replayed (first handled at ")
    assert "status applied" in again.detail
    assert routing.calls == [("fail_over", "eth0", "eth1")], "applied once"


def test_a_replay_is_refused_after_a_restart(tmp_path: Path) -> None:
    first = RecordingRouting()
    cmd = _cmd()
    assert _actuator(tmp_path / "state", first).handle(cmd).status == "applied"
    routing = RecordingRouting()
    ack = _actuator(tmp_path / "state", routing).handle(cmd)   # a new actuator on the same state dir
    assert ack.status == "refused" and "replayed" in ack.detail
    assert routing.calls == []


def test_a_command_interrupted_mid_apply_is_applied_again_after_a_restart(tmp_path: Path) -> None:
    cmd = _cmd()
    seen = SeenCommands(tmp_path / "state", clock=Clock())
    assert seen.claim(cmd.command_id, cmd.expires_ns) is None   # recorded as started, then the process died
    seen.close()
    routing = RecordingRouting()
    assert _actuator(tmp_path / "state", routing).handle(cmd).status == "applied"
    assert routing.calls == [("fail_over", "eth0", "eth1")]


def test_a_torn_last_line_is_ignored_and_repaired(tmp_path: Path) -> None:
    cmd = _cmd()
    assert _actuator(tmp_path / "state").handle(cmd).status == "applied"
    path = tmp_path / "state" / "seen-commands.jsonl"
    with open(path, "ab") as f:
        f.write(b'{"id": "torn-by-a-cr')                 # a crash mid-append
    seen = SeenCommands(tmp_path / "state", clock=Clock())
    assert seen.torn_lines == 1
    assert seen.get(cmd.command_id) is not None and seen.get(cmd.command_id).status == "applied"  # type: ignore[union-attr]
    assert path.read_bytes().endswith(b"\n") and b"torn" not in path.read_bytes(), "repaired on open"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_ids_are_kept_past_expiry_then_compacted(tmp_path: Path) -> None:
    cmd = _cmd()
    clock = Clock()
    assert _actuator(tmp_path / "state", clock=clock).handle(cmd).status == "applied"
    clock.now = cmd.expires_ns + 600 * S      # expired, but a copy signed again later (a redelivery) may be valid
    assert SeenCommands(tmp_path / "state", clock=clock).get(cmd.command_id) is not None
    clock.now = cmd.ts_ns + MAX_LIFETIME_NS + 3600 * S   # no copy can be valid any more: dropped on open
    assert len(SeenCommands(tmp_path / "state", clock=clock)) == 0


def test_a_long_running_memory_drops_expired_ids_without_a_restart(tmp_path: Path) -> None:
    """Before: expired ids were dropped only when the file was opened; an actuator running for months kept them all."""
    from clocktower.actuators.seen_commands import COMPACT_AFTER_LINES

    clock = Clock()
    seen = SeenCommands(tmp_path / "state", clock=clock)
    path = tmp_path / "state" / "seen-commands.jsonl"
    n = 3 * COMPACT_AFTER_LINES
    live = 60 + 600            # one command a second, each kept its 60 s lifetime plus the 10 min margin
    for i in range(n):
        clock.now += S
        assert seen.claim(f"cmd-{i}", clock.now + 60 * S) is None
        seen.finish(f"cmd-{i}", "applied")
    assert seen.compactions >= 4                               # on open, and again and again while running
    assert len(seen) <= 2 * live + 1                           # bounded by the window, not by the run's length
    assert len(path.read_bytes().splitlines()) <= 2 * (2 * live + 1)
    assert seen.get("cmd-0") is None and seen.get(f"cmd-{n - live + 5}") is not None
    assert seen.claim(f"cmd-{n - 1}", clock.now + 60 * S) is not None   # a live id is still a replay
    seen.close()


def test_an_empty_backup_is_refused(act: Actuator, routing: RecordingRouting) -> None:
    ack = act.handle(_cmd(target="mlx5_0/1", params={"from": "mlx5_0/1", "to": ""}))
    assert ack.status == "refused" and "no backup port" in ack.detail
    assert routing.calls == []


@pytest.mark.parametrize("action", ["failover", "quarantine", "restore", "release"])
def test_a_signed_command_naming_another_backup_is_refused(action: str, act: Actuator,
                                                           routing: RecordingRouting) -> None:
    """Issue 18: a forged link report naming backup "lo" got a signed failover {"to": "lo"}, and the actuator moved
    the node's default route there. The node's own backup (eth1) is the only one a command may name."""
    routing.sim.fail_over("eth0", "eth1")   # (restore and release have something to move back)
    if action == "release":
        act.quarantine.mark("eth0", "eth1", "earlier")
    routing.calls.clear()
    forged = {"from": "eth0", "to": "lo"} if action in ("failover", "quarantine") else {"from": "lo", "to": "eth0"}
    ack = act.handle(_cmd(action, params=forged))
    assert ack.status == "refused" and "names 'lo' as eth0's backup port, but this node's is 'eth1'" in ack.detail
    assert routing.calls == []


def test_a_link_with_no_backup_of_its_own_is_not_moved(act: Actuator, routing: RecordingRouting) -> None:
    ack = act.handle(_cmd(target="eth1", params={"from": "eth1", "to": "eth0"}))
    assert ack.status == "refused" and "knows no backup port for eth1" in ack.detail
    assert routing.calls == []


@pytest.mark.parametrize("action", ["qos"])   # rate_limit, pause, resume: tests/test_actuator_qos.py
def test_unsupported_actions_are_refused(action: str, act: Actuator, routing: RecordingRouting) -> None:
    ack = act.handle(_cmd(action=action, params={}))
    assert ack.status == "refused" and "not supported by this actuator" in ack.detail
    assert routing.calls == []


def test_malformed_record_refusal(act: Actuator) -> None:
    ack = act.refuse("cmd-1", "malformed: expires_ns: field required", "failover", "eth0")
    assert ack.status == "refused" and ack.command_id == "cmd-1" and "malformed" in ack.detail


# -- applying --------------------------------------------------------------------------------------------------

def test_failover_then_restore(act: Actuator, routing: RecordingRouting) -> None:
    ack = act.handle(_cmd("failover"))
    assert ack.status == "applied" and ack.apply_ns > 0 and ack.action == "failover" and ack.origin == "command"
    assert routing.on_backup("eth0")
    ack = act.handle(_cmd("restore", ts_ns=T0 + 1))
    assert ack.status == "applied" and not routing.on_backup("eth0")
    assert routing.calls == [("fail_over", "eth0", "eth1"), ("restore", "eth0", "eth1")]


def test_failover_is_idempotent(act: Actuator, routing: RecordingRouting) -> None:
    assert act.handle(_cmd(ts_ns=T0)).detail == "moved the routes of eth0 to eth1"
    ack = act.handle(_cmd(ts_ns=T0 + 1))                   # another command, same effect
    assert ack.status == "applied" and ack.detail == "already on eth1"


def test_a_routing_error_is_a_failed_ack(act: Actuator, routing: RecordingRouting) -> None:
    routing.sim.set_link_up("eth1", False)
    ack = act.handle(_cmd())
    assert ack.status == "failed" and "backup eth1 is down" in ack.detail
    assert act.seen.get(ack.command_id).status == "failed"  # type: ignore[union-attr]


def test_an_unexpected_exception_is_a_failed_ack(act: Actuator, routing: RecordingRouting) -> None:
    def boom(link: str, backup: str) -> str:
        raise ZeroDivisionError("bug")
    routing.fail_over = boom  # type: ignore[method-assign]
    ack = act.handle(_cmd())
    assert ack.status == "failed" and "bug" in ack.detail


def test_quarantine_holds_until_release(tmp_path: Path, routing: RecordingRouting) -> None:
    act = _actuator(tmp_path / "state", routing)
    ack = act.handle(_cmd("quarantine"))
    assert ack.status == "applied" and routing.on_backup("eth0") and "quarantined" in ack.detail
    ack = act.handle(_cmd("restore", ts_ns=T0 + 1))
    assert ack.status == "refused" and f"clocktower control release {NODE} eth0" in ack.detail
    assert routing.on_backup("eth0"), "still on the backup"
    # the mark survives a restart
    routing2 = RecordingRouting()
    routing2.sim.fail_over("eth0", "eth1")
    act2 = _actuator(tmp_path / "state", routing2)
    assert act2.handle(_cmd("restore", ts_ns=T0 + 2)).status == "refused"
    ack = act2.handle(_cmd("release", params={}, ts_ns=T0 + 3))   # the CLI may name no backup: the mark has it
    assert ack.status == "applied" and "released eth0" in ack.detail
    assert not routing2.on_backup("eth0") and act2.quarantine.get("eth0") is None
    assert act2.handle(_cmd("restore", ts_ns=T0 + 4)).status == "applied"


def test_a_failed_release_keeps_the_mark(act: Actuator, routing: RecordingRouting) -> None:
    act.handle(_cmd("quarantine"))
    routing.sim.set_link_up("eth0", False)
    ack = act.handle(_cmd("release", ts_ns=T0 + 1))
    assert ack.status == "failed" and act.quarantine.get("eth0") is not None


def test_release_of_a_link_not_quarantined_and_no_backup_is_refused(act: Actuator, routing: RecordingRouting) -> None:
    ack = act.handle(_cmd("release", params={}))
    assert ack.status == "refused" and routing.calls == []


def _script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "hook.sh"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


@pytest.mark.parametrize("action", ["drain", "spare", "undrain"])
def test_drain_and_spare_run_the_hook_with_the_command_fields(action: str, tmp_path: Path) -> None:
    out = tmp_path / "args"
    hook = _script(tmp_path, f'printf "%s\\n" "$@" > {out}; echo "id=$CLOCKTOWER_COMMAND_ID"; echo done\n')
    act = _actuator(tmp_path / "state", hooks=Hooks({action: [hook, "--fixed"]}))
    cmd = _cmd(action, target=NODE, params={"replace": NODE})
    ack = act.handle(cmd)
    assert ack.status == "applied" and f"id={cmd.command_id}" in ack.detail and "done" in ack.detail, ack
    assert out.read_text().splitlines() == ["--fixed", action, NODE, NODE, '{"replace":"node-a"}']


def test_arguments_never_go_through_a_shell(tmp_path: Path) -> None:
    out = tmp_path / "args"
    hook = _script(tmp_path, f'printf "%s\\n" "$@" > {out}\n')
    act = _actuator(tmp_path / "state", hooks=Hooks({"drain": [hook]}))
    evil = "$(touch pwned);x"
    assert act.handle(_cmd("drain", target=evil, params={})).status == "applied"
    assert evil in out.read_text().splitlines() and not (tmp_path / "pwned").exists()


def test_a_hook_never_sees_the_agent_s_secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLOCKTOWER_KAFKA_SASL_PASSWORD", "sasl-secret")
    monkeypatch.setenv("CLOCKTOWER_NODE_KEY", "node-key-secret")
    hook = _script(tmp_path, "env\n")
    ack = _actuator(tmp_path / "state", hooks=Hooks({"drain": [hook]})).handle(_cmd("drain", params={}))
    assert ack.status == "applied" and "CLOCKTOWER_ACTION=drain" in ack.detail and "PATH=" in ack.detail
    assert "secret" not in ack.detail, ack.detail


def test_a_failing_hook_is_a_failed_ack_with_its_output(tmp_path: Path) -> None:
    hook = _script(tmp_path, "echo 'scontrol: node unknown' >&2; exit 3\n")
    ack = _actuator(tmp_path / "state", hooks=Hooks({"drain": [hook]})).handle(_cmd("drain", params={}))
    assert ack.status == "failed" and "exited with 3" in ack.detail and "node unknown" in ack.detail


def test_a_hook_past_its_timeout_is_killed(tmp_path: Path) -> None:
    hook = _script(tmp_path, "echo started; sleep 30 & sleep 30\n")
    ack = _actuator(tmp_path / "state", hooks=Hooks({"drain": [hook]}, timeout_s=0.3)).handle(_cmd("drain", params={}))
    assert ack.status == "failed" and "timed out after 0.3 s" in ack.detail and "started" in ack.detail


def test_a_hook_output_is_bounded(tmp_path: Path) -> None:
    hook = _script(tmp_path, "head -c 100000 /dev/zero | tr '\\0' x\n")
    ack = _actuator(tmp_path / "state", hooks=Hooks({"drain": [hook]})).handle(_cmd("drain", params={}))
    assert ack.status == "applied" and len(ack.detail) < 2100


def test_a_missing_hook_is_refused(act: Actuator) -> None:
    ack = act.handle(_cmd("drain", params={}))
    assert ack.status == "refused" and "no drain hook configured" in ack.detail


def test_a_hook_that_cannot_start_is_a_failed_ack(tmp_path: Path) -> None:
    ack = _actuator(tmp_path / "state", hooks=Hooks({"drain": [str(tmp_path / "missing")]})).handle(
        _cmd("drain", params={}))
    assert ack.status == "failed" and "could not start" in ack.detail


def test_the_recording_fake_is_a_link_routing() -> None:
    assert isinstance(RecordingRouting(), LinkRouting) and issubclass(RoutingError, Exception)
