"""`clocktower control`: the operator's hand on the control plane.

- `keygen DIR` writes an Ed25519 pair (control.key 0600 for the streams, control.pub for every actuator), for a
  cluster whose streams do not run under `clocktower up`.
- `release NODE IFACE` lifts a link's quarantine: it signs a `release` command with the streams' private key (the
  operator's CLI is the only other holder), sends it to NODE's partition of control.commands, and waits for the
  node's ack. The actuator then restores the link's routes.
- `approve NODE INCIDENT` approves a replacement the fleet's budget withheld: the request, signed with the control
  key, goes to the allocator, which orders the drain and spare outside the budget (control/approval.py); it waits for
  the node's ack of the drain.
- `undrain NODE` returns a drained node to service: the same way, an `undrain` command whose actuator runs the
  operator's undrain hook (CLOCKTOWER_ACTUATOR_UNDRAIN_HOOK: Slurm `resume`, `kubectl uncordon`).

With CLOCKTOWER_PRODUCER_KEY set, only an ack signed by the node (`ct-node-mac`) is believed: anyone who can
produce to control.acks once made `release` print "applied" and exit 0 with a forged, unsigned one (issue 18).
Without it, the ack is shown as unverified.
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

from confluent_kafka import OFFSET_END, Consumer, Producer, TopicPartition
from rich.console import Console
from rich.markup import escape

from clocktower.config import Settings
from clocktower.control.approval import approve
from clocktower.control.intent import CommandIntent, command_id_of
from clocktower.control.issuer import CommandIssuer
from clocktower.control.key_files import signer_from
from clocktower.generated_secrets import ensure_control_keys
from clocktower.producers.kafka_publisher import KafkaPublisher
from clocktower.running_broker import running_bootstrap
from clocktower.runtime.broker_profile import LIBRDKAFKA_MAX_RESPONSE_BYTES
from clocktower.runtime.credentials import producer_key_of
from clocktower.runtime.errors import UserError
from clocktower.runtime.private_file import private_dir
from clocktower.schemas.codec import DecodeError, decode_batch, encode_batch
from clocktower.schemas.control import ControlAck, ControlCommand, ReplacementRequest
from clocktower.schemas.kafka_security import KafkaSecurity
from clocktower.schemas.partitioning import partition_of
from clocktower.schemas.record_mac import check
from clocktower.schemas.topics import BY_MODEL

RELEASE_TTL_NS = 120 * 10**9     # an operator's command is valid this long (release and undrain)


def add_parser(sub: argparse._SubParsersAction, common: object) -> None:
    c = sub.add_parser("control", help="operator commands to nodes: release a quarantined link, make a key pair")
    csub = c.add_subparsers(dest="control_command", required=True)
    k = csub.add_parser("keygen", help="write an Ed25519 control key pair (control.key, control.pub) into DIR")
    k.add_argument("dir", type=Path)
    r = csub.add_parser("release", help="lift a link's quarantine: the node restores its routes")
    r.add_argument("node")
    r.add_argument("iface")
    r.add_argument("--wait", type=float, default=15.0, help="seconds to wait for the node's ack (0: do not wait)")
    common(r)   # type: ignore[operator]
    u = csub.add_parser("undrain", help="return a drained node to service: its actuator runs the undrain hook")
    u.add_argument("node")
    u.add_argument("--wait", type=float, default=45.0,
                   help="seconds to wait for the node's ack (0: do not wait; the hook may take its timeout)")
    common(u)   # type: ignore[operator]
    a = csub.add_parser("approve", help="approve a node replacement (drain + spare) the fleet's budget withheld")
    a.add_argument("node")
    a.add_argument("incident", help="the incident id of the withheld request (its `incidents` row)")
    a.add_argument("--wait", type=float, default=60.0,
                   help="seconds to wait for the node's ack of the drain (0: do not wait)")
    common(a)   # type: ignore[operator]


def cmd_control(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    if args.control_command == "keygen":
        private_dir(args.dir)
        if not ensure_control_keys(args.dir):
            raise UserError(f"{args.dir} already holds control.key: kept (delete it to make a new pair)")
        console.print(f"wrote {escape(str(args.dir))}/control.key (0600: the streams' signing key, keep it there) "
                      "and control.pub (copy it to every node's actuator)", highlight=False)
        return 0
    if args.control_command == "approve":
        return _approve(args, settings, console)
    if args.control_command == "undrain":
        if not args.node:
            raise UserError("undrain needs a node")
        return _operator_command(args, settings, console, "undrain", args.node, {})
    if not args.node or not args.iface:
        raise UserError("release needs a node and an interface")
    return _operator_command(args, settings, console, "release", args.iface, {"to": args.iface})


def _operator_command(args: argparse.Namespace, settings: Settings, console: Console, action: str, target: str,
                      params: dict[str, str]) -> int:
    """Sign `action` for args.node with the streams' key, send it to the node's partition, wait for its ack."""
    issuer = CommandIssuer(signer_from(settings), ttl_ns=RELEASE_TTL_NS)
    cmd = issuer.issue(CommandIntent(args.node, action, target, time.time_ns(),  # type: ignore[arg-type]
                                     f"operator-{action}-{uuid.uuid4().hex[:12]}", params))
    bootstrap = running_bootstrap(settings)
    login = KafkaSecurity().librdkafka()
    acks = _ack_reader(bootstrap, login) if args.wait > 0 else None
    producer_key = producer_key_of(settings.data_dir)   # configured, else the one `up` made in the data dir
    vouch = partial(check, producer_key) if producer_key else None
    ignored: list[str] = []
    try:
        _send(bootstrap, login, cmd)
        what = escape(args.node) if target == args.node else f"{escape(args.node)}/{escape(target)}"
        console.print(f"sent {action} of {what}: command {escape(cmd.command_id)}", highlight=False)
        if acks is None:
            return 0
        ack = _wait_ack(acks, cmd, args.wait, vouch, ignored)
    finally:
        if acks is not None:
            acks.close()
    for reason in ignored:
        console.print(f"[yellow]ignored an ack for this command that the node did not sign: {escape(reason)}"
                      "[/yellow]", highlight=False)
    if ack is None:
        raise UserError(f"no ack from {args.node} within {args.wait:g} s"
                        + (" signed by the node" if ignored else "") + ": is its agent running with --actuate?")
    unverified = "" if vouch is not None else " (unverified: set CLOCKTOWER_PRODUCER_KEY to check the node's MAC)"
    console.print(f"{escape(args.node)}: {ack.status}: {escape(ack.detail)}{unverified}", highlight=False)
    return 0 if ack.status == "applied" else 1


def _approve(args: argparse.Namespace, settings: Settings, console: Console) -> int:
    """Sign the withheld request of `args.node` for `args.incident` with the control key, send it to the fleet's
    allocator (control.replacements, node-signed where a producer key is in force), wait for the drain's ack. The
    allocator grants only a request it held back itself, once, so a row planted in the tables orders nothing."""
    from clickhouse_connect.driver.exceptions import ClickHouseError

    from clocktower.query import open_client
    from clocktower.streams.detectors.replacement_allocator import Replacement, ReplacementAllocator

    bootstrap = running_bootstrap(settings)
    signer = signer_from(settings)
    try:
        rows = open_client(settings).query(
            "SELECT DISTINCT ts_ns, reason, gpu FROM replacement_requests WHERE node = {n:String} AND "
            "incident_id = {i:String} AND approval = '' AND _node_mac IN ('valid', 'unchecked')",
            parameters={"n": args.node, "i": args.incident}).result_rows
    except ClickHouseError as exc:
        line = str(exc).strip().splitlines()[0]
        raise UserError(f"cannot read the replacement requests: {line[line.find('Code: '):]}") from None
    if not rows:
        raise UserError(f"no replacement request of {args.node} for incident {args.incident}: the withheld ones are "
                        "in `clocktower query \"SELECT node, incident_id, detail FROM incidents WHERE detail LIKE "
                        "'%withheld%'\"`")
    if len(rows) > 1:
        raise UserError(f"{len(rows)} different requests of {args.node} for incident {args.incident} (fault times "
                        f"{sorted(r[0] for r in rows)}): one was not the streams'; nothing approved")
    ts_ns, reason, gpu = rows[0]
    # known_for_ns stays 0: the allocator grants an approval of a request it held back, found by node, fault time,
    # reason and GPU (the fields its state keeps), and checks the signature over the request as sent
    req = approve(signer, ReplacementRequest(node=args.node, ts_ns=ts_ns, incident_id=args.incident, reason=reason,
                                             gpu=gpu))
    login = KafkaSecurity().librdkafka()
    acks = _ack_reader(bootstrap, login) if args.wait > 0 else None
    producer_key = producer_key_of(settings.data_dir)
    ignored: list[str] = []
    try:
        publisher = KafkaPublisher(bootstrap, producer_key=producer_key)   # signed in the node's name
        publisher.publish([req])
        if publisher.flush(15) != 0 or publisher.failed:
            raise UserError(f"the broker at {bootstrap} did not take the approval within 15 s: {publisher.errors[:1]}")
        console.print(f"sent the approval of {escape(args.node)}'s replacement (incident {escape(args.incident)})",
                      highlight=False)
        if acks is None:
            return 0
        drain = command_id_of(ReplacementAllocator._intent(  # noqa: SLF001 - the id the allocator orders it under
            "drain", args.node, Replacement("", ts_ns, args.incident, reason, gpu), ts_ns))
        vouch = partial(check, producer_key) if producer_key else None
        ack = _wait_ack(acks, _Awaited(drain, args.node), args.wait, vouch, ignored)
    finally:
        if acks is not None:
            acks.close()
    for reason_ignored in ignored:
        console.print(f"[yellow]ignored an ack of the drain that the node did not sign: {escape(reason_ignored)}"
                      "[/yellow]", highlight=False)
    if ack is None:
        raise UserError(f"no ack of the drain from {args.node} within {args.wait:g} s: the allocator orders only a "
                        "request it held back itself, once (the streams' log names a refused approval); is the "
                        "node's agent running with --actuate?")
    console.print(f"{escape(args.node)}: drain {ack.status}: {escape(ack.detail)}", highlight=False)
    return 0 if ack.status == "applied" else 1


class _Awaited:
    """The command whose ack `_wait_ack` waits for: its id and node."""

    def __init__(self, command_id: str, node: str) -> None:
        self.command_id, self.node = command_id, node


def _send(bootstrap: str, login: dict[str, str], cmd: ControlCommand) -> None:
    spec = BY_MODEL[ControlCommand]
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, **login})
    meta = producer.list_topics(timeout=10).topics.get(spec.name)   # by name would auto-create it on some brokers
    if meta is None or meta.error is not None or not meta.partitions:
        raise UserError(f"topic {spec.name} is not there: has `clocktower up` (or the topics job) run?")
    key, value, headers = encode_batch([cmd])
    producer.produce(spec.name, key=key, value=value, headers=headers,
                     partition=partition_of(cmd.node, len(meta.partitions)))
    if producer.flush(15) != 0:
        raise UserError(f"the broker at {bootstrap} did not take the command within 15 s")


def _ack_reader(bootstrap: str, login: dict[str, str]) -> Consumer:
    """A consumer of control.acks from their current end (set before the command is sent: no ack is missed)."""
    topic = BY_MODEL[ControlAck].name
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"clocktower-cli-{uuid.uuid4().hex}",
                         "enable.auto.commit": False,
                         "receive.message.max.bytes": LIBRDKAFKA_MAX_RESPONSE_BYTES,   # (runtime/broker_profile.py)
                         **login})
    meta = consumer.list_topics(timeout=10).topics.get(topic)
    parts = sorted(meta.partitions) if meta is not None and meta.partitions else [0]
    ends = [consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts]
    consumer.assign([TopicPartition(topic, p, end if end >= 0 else OFFSET_END) for p, end in zip(parts, ends,
                                                                                              strict=True)])
    return consumer


Vouch = Callable[[str, bytes | None, bytes | None, Sequence[tuple[str, bytes | None]]], str | None]


def _wait_ack(consumer: Consumer, cmd: ControlCommand | _Awaited, wait_s: float, vouch: Vouch | None = None,
              ignored: list[str] | None = None) -> ControlAck | None:
    """The node's ack of `cmd`; with `vouch`, only one in a record the node signed (the reasons others were not
    believed go to `ignored`)."""
    deadline = time.monotonic() + wait_s
    while (left := deadline - time.monotonic()) > 0:
        for msg in consumer.consume(num_messages=100, timeout=min(left, 0.5)):
            if msg.error() is not None:
                continue
            try:
                events = decode_batch(msg.topic(), msg.key(), msg.value(), msg.headers()).events
            except DecodeError:
                continue
            for ack in events:
                if isinstance(ack, ControlAck) and ack.command_id == cmd.command_id and ack.node == cmd.node:
                    refused = vouch(msg.topic(), msg.key(), msg.value(), msg.headers() or []) if vouch else None
                    if refused is None:
                        return ack
                    if ignored is not None:
                        ignored.append(refused)
        time.sleep(0.05)   # the embedded broker answers empty fetches at once
    return None
