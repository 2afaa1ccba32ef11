"""Control commands no node can forge: Ed25519 signing at the streams' edge, verification with the public key only.

Detectors return intents and hold no key; the one issuer signs them. An actuator holds only the public key, and
`refusal()` names why a command must not be applied: unsigned, forged or altered, another node's, expired, or
valid for too long.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from clocktower.control.command_check import MAX_LIFETIME_NS, refusal
from clocktower.control.intent import CommandIntent, command_id_of
from clocktower.control.issuer import CommandIssuer
from clocktower.control.key_files import signer_from, verifier_from_file
from clocktower.control.keys import BadKeyFile, load_private_key, load_public_key, new_key_pair
from clocktower.control.signing import CommandSigner, CommandVerifier
from clocktower.generated_secrets import ensure_control_keys
from clocktower.runtime.credentials import control_key_path, control_public_key_path
from clocktower.runtime.errors import UserError
from clocktower.runtime.settings import RuntimeSettings
from clocktower.schemas.analytics import Incident
from clocktower.schemas.control import ControlCommand, ReplacementRequest
from clocktower.schemas.telemetry import GpuHealth
from clocktower.streams.detectors.gpu_fault import GpuFaultDetector
from clocktower.streams.detectors.replacement_allocator import ReplacementAllocator
from clocktower.streams.processors import Processors
from clocktower.streams.remediation_budget import RemediationBudget
from clocktower.streams.state_store import StateStore
from tests.control_keys import TEST_SIGNER, TEST_VERIFIER, resigned
from tests.event_samples import GPU_READINGS

T0 = 1_780_000_000 * 10**9
S = 10**9
CONTROL = Path(__file__).resolve().parents[1] / "control"
OTHER = CommandVerifier(Ed25519PrivateKey.generate().public_key())


def _gpu(ts: int, **kw: object) -> GpuHealth:
    return GpuHealth(node="node-3", ts_ns=ts, gpu=5, uuid="GPU-x", **{**GPU_READINGS, **kw})


def _command(**intent: object) -> ControlCommand:
    fields = {"node": "node-1", "action": "failover", "target": "eth0", "ts_ns": T0, "incident_id": "inc",
              "params": {"from": "eth0", "to": "eth1"}, **intent}
    return CommandIssuer(TEST_SIGNER).issue(CommandIntent(**fields))  # type: ignore[arg-type]


def test_the_streams_sign_at_their_edge_and_only_the_pair_s_public_key_verifies() -> None:
    processors = Processors(TEST_SIGNER, clock_ns=lambda: T0 + 2 * S, known_after_ns=0)
    out = processors.on_batch([_gpu(T0)]) + processors.on_batch([_gpu(T0 + S, xid=79)])
    cmds = [e for e in out if isinstance(e, ControlCommand)]
    assert [c.action for c in cmds] == ["drain"]       # no spare pool configured: no spare
    assert all(TEST_VERIFIER.verify(c) for c in cmds) and not any(OTHER.verify(c) for c in cmds)
    assert not any(isinstance(e, CommandIntent) for e in out), "no intent leaves the streams unsigned"
    incident = next(e for e in out if isinstance(e, Incident))
    assert {c.incident_id for c in cmds} == {incident.incident_id}


def test_detectors_hold_no_key_and_the_issuer_gives_the_ids_they_predict() -> None:
    issued_at = T0 + 90 * S   # the streams were 90 s behind: the commands are valid for 60 s from now all the same
    allocator = ReplacementAllocator(spare_nodes=("spare-1",), budget=RemediationBudget(clock_ns=lambda: issued_at))
    gpus = GpuFaultDetector()
    gpu_store, fleet_store = StateStore(gpus), StateStore(allocator)
    asks = gpus.process(gpu_store, _gpu(T0)) + gpus.process(gpu_store, _gpu(T0 + S, xid=79))
    intents = [o for a in asks if isinstance(a, ReplacementRequest) for o in allocator.process(fleet_store, a)]
    asked = [i for i in intents if isinstance(i, CommandIntent)]
    signed = [c for c in CommandIssuer(TEST_SIGNER, clock_ns=lambda: issued_at).signed(intents)
              if isinstance(c, ControlCommand)]
    assert [c.command_id for c in signed] == [command_id_of(i) for i in asked] and len(signed) == 2
    assert all(c.expires_ns == issued_at + 60 * S for c in signed)


def test_ed25519_signatures_are_deterministic_and_cover_every_field() -> None:
    cmd = _command()
    assert cmd == _command() and len(cmd.signature) == 86 and TEST_VERIFIER.verify(cmd)
    for change in ({"node": "node-2"}, {"params": {"to": "eth9"}}, {"expires_ns": cmd.expires_ns + 1},
                   {"incident_id": "other"}, {"command_id": "replayed"}, {"action": "restore"},
                   {"target": "eth1"}, {"ts_ns": cmd.ts_ns + 1}):
        assert not TEST_VERIFIER.verify(cmd.model_copy(update=change)), change
    for sig in ("-", "", "A" * 86, cmd.signature[:-1], cmd.signature + "A", "!" * 86):
        assert not TEST_VERIFIER.verify(cmd.model_copy(update={"signature": sig})), sig


def test_the_issuer_never_makes_a_command_the_actuators_would_refuse_as_too_long_lived() -> None:
    cmd = CommandIssuer(TEST_SIGNER, ttl_ns=MAX_LIFETIME_NS + S, clock_ns=lambda: T0).issue(
        CommandIntent("node-1", "failover", "eth0", T0, "inc"))
    assert cmd.expires_ns == T0 + MAX_LIFETIME_NS
    late = CommandIssuer(TEST_SIGNER, clock_ns=lambda: T0 + 2 * MAX_LIFETIME_NS).issue(
        CommandIntent("node-1", "failover", "eth0", T0, "inc"))
    assert refusal(late, node="node-1", now_ns=T0 + 2 * MAX_LIFETIME_NS, verifier=TEST_VERIFIER).startswith("expired")


@pytest.mark.parametrize(("case", "reason"), [
    ("good", None),
    ("unsigned", "unsigned"),
    ("forged", "bad signature"),
    ("altered", "bad signature"),
    ("foreign", "scoped to node 'node-2', not to this node 'node-1'"),
    ("expired", "expired 1.000 s ago"),
    ("too_long", "more than the 3600 s allowed"),
])
def test_refusal_names_why(case: str, reason: str | None) -> None:
    now = T0 + S
    cmd = {
        "good": _command(),
        "unsigned": _command().model_copy(update={"signature": "-"}),
        "forged": CommandIssuer(CommandSigner(Ed25519PrivateKey.generate())).issue(
            CommandIntent("node-1", "failover", "eth0", T0, "inc")),
        "altered": _command().model_copy(update={"params": {"to": "eth7"}}),
        "foreign": _command(node="node-2"),
        "expired": CommandIssuer(TEST_SIGNER, ttl_ns=S // 2, clock_ns=lambda: T0 - S // 2).issue(
            CommandIntent("node-1", "failover", "eth0", T0 - S // 2, "inc")),
        "too_long": resigned(_command().model_copy(update={"expires_ns": T0 + MAX_LIFETIME_NS + S})),
    }[case]
    got = refusal(cmd, node="node-1", now_ns=now, verifier=TEST_VERIFIER)
    assert got == reason if reason is None else reason in (got or ""), got


def test_key_files_round_trip_and_bad_ones_are_refused_with_their_name(tmp_path: Path) -> None:
    private, public = new_key_pair()
    signer = CommandSigner(load_private_key(private, "p"))
    cmd = CommandIssuer(signer).issue(CommandIntent("node-1", "drain", "node-1", T0))
    assert CommandVerifier(load_public_key(public, "q")).verify(cmd)
    rsa_pem = rsa.generate_private_key(public_exponent=65537, key_size=1024).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    for bad in (b"", b"not a key", rsa_pem, public):
        with pytest.raises(BadKeyFile, match="/etc/x"):
            load_private_key(bad, "/etc/x")
    with pytest.raises(BadKeyFile, match="/etc/y"):
        load_public_key(private, "/etc/y")


def test_up_makes_a_pair_once_and_moves_an_old_hmac_key_aside(tmp_path: Path) -> None:
    d = tmp_path / "ct"
    d.mkdir(mode=0o700)
    control_key_path(d).write_bytes(b"an-old-shared-hmac-secret-of-32-bytes-or-more\n")
    assert ensure_control_keys(d) and (d / "control.key.hmac-old").exists()
    assert os.stat(control_key_path(d)).st_mode & 0o777 == 0o600
    assert os.stat(control_public_key_path(d)).st_mode & 0o777 == 0o644
    before = control_key_path(d).read_bytes()
    assert not ensure_control_keys(d) and control_key_path(d).read_bytes() == before
    signer = signer_from(RuntimeSettings(data_dir=d))
    cmd = CommandIssuer(signer).issue(CommandIntent("node-1", "drain", "node-1", T0))
    assert verifier_from_file(control_public_key_path(d)).verify(cmd)


def test_no_key_means_no_start_and_an_external_cluster_never_gets_the_data_dir_s(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch
                                                                               ) -> None:
    for name in list(os.environ):
        if name.startswith("CLOCKTOWER_"):
            monkeypatch.delenv(name)
    with pytest.raises(UserError, match="run `clocktower up` once"):
        signer_from(RuntimeSettings(data_dir=tmp_path))
    tmp_path.chmod(0o700)
    ensure_control_keys(tmp_path)
    with pytest.raises(UserError, match="with an external Kafka set CLOCKTOWER_CONTROL_PRIVATE_KEY_FILE"):
        signer_from(RuntimeSettings(data_dir=tmp_path, kafka_bootstrap="kafka:9092"))
    given = signer_from(RuntimeSettings(data_dir=tmp_path, kafka_bootstrap="kafka:9092",
                                        control_private_key_file=control_key_path(tmp_path)))
    assert isinstance(given, CommandSigner)
    with pytest.raises(ValueError, match="no longer used"):
        RuntimeSettings(data_dir=tmp_path, control_key="k" * 32)


def test_a_world_writable_public_key_is_not_trusted(tmp_path: Path) -> None:
    path = tmp_path / "control.pub"
    path.write_bytes(new_key_pair()[1])
    path.chmod(0o666)
    with pytest.raises(UserError, match="writable by other users"):
        verifier_from_file(path)
    path.chmod(0o644)
    assert isinstance(verifier_from_file(path), CommandVerifier)
    if os.geteuid() == 0:   # only root can give a file away (the build machines run as root)
        os.chown(path, 4242, 4242)   # another user's file: they could swap in their own key
        with pytest.raises(UserError, match="belongs to uid 4242"):
            verifier_from_file(path)


def test_control_imports_only_schemas_runtime_and_libraries() -> None:
    """The actuators import control/; it must not pull in the stream processors, sinks, producers or the CLI."""
    offenders = []
    for path in CONTROL.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{path.name}: {n}" for n in names if n.startswith("clocktower")
                          and not n.startswith(("clocktower.schemas", "clocktower.control", "clocktower.runtime"))]
    assert offenders == []


def test_the_stream_worker_refuses_to_start_without_a_key_in_one_line(tmp_path: Path) -> None:
    import subprocess
    import sys
    tmp_path.chmod(0o700)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLOCKTOWER_")}
    env |= {"CLOCKTOWER_DATA_DIR": str(tmp_path), "CLOCKTOWER_KAFKA_BOOTSTRAP": "127.0.0.1:1"}
    r = subprocess.run([sys.executable, "-m", "clocktower.streams"], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and r.stdout == "", r
    assert r.stderr.splitlines() == ["error: no control signing key: with an external Kafka set "
                                     "CLOCKTOWER_CONTROL_PRIVATE_KEY_FILE (`clocktower control keygen DIR` makes a "
                                     "key pair)"], r.stderr


def test_a_link_command_for_a_stale_report_is_issued_expired_and_a_drain_is_not() -> None:
    """A failover for a link report 90 s old would act on a state the node has reported past since (and its own
    watchdog handled); a drain for a GPU lost 90 s ago must still reach the node."""
    issuer = CommandIssuer(TEST_SIGNER, clock_ns=lambda: T0 + 90 * S)
    stale = issuer.issue(CommandIntent("node-1", "failover", "eth0", T0, "inc", {"from": "eth0", "to": "eth1"}))
    fresh = issuer.issue(CommandIntent("node-1", "failover", "eth0", T0 + 50 * S, "inc",
                                       {"from": "eth0", "to": "eth1"}))
    drain = issuer.issue(CommandIntent("node-1", "drain", "node-1", T0, "inc"))
    assert stale.expires_ns == T0 + 60 * S and fresh.expires_ns == drain.expires_ns == T0 + 150 * S
    now = T0 + 91 * S
    assert refusal(stale, node="node-1", now_ns=now, verifier=TEST_VERIFIER).startswith("expired")
    assert refusal(fresh, node="node-1", now_ns=now, verifier=TEST_VERIFIER) is None
    assert refusal(drain, node="node-1", now_ns=now, verifier=TEST_VERIFIER) is None
