"""What can still be read from a control.commands record that fails decoding: the ids of the commands in it.

A record that is not a valid batch of commands is never applied; but when it names command ids, each gets a
`refused` ack saying why, so whoever sent it sees the answer. Pure parsing, nothing trusted: only string
fields are taken, and at most `MAX_IDS` of them (one forged record naming 100 ids once got 100 refused acks: an
amplifier into control.acks, issue 18).
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

MAX_IDS = 4   # a genuine batch is a few commands; the rest of a malformed one is counted, not answered


@dataclass(frozen=True)
class NamedCommand:
    command_id: str
    action: str
    target: str


def named_commands(value: bytes | None, node: str) -> list[NamedCommand]:
    """The commands `value` names for `node` (or for no node), by id; [] when it names none or is not JSON."""
    try:
        doc = orjson.loads(value or b"")
    except orjson.JSONDecodeError:
        return []
    items = doc if isinstance(doc, list) else [doc]
    out: list[NamedCommand] = []
    for item in items[:MAX_IDS]:
        if not isinstance(item, dict):
            continue
        cid, for_node = item.get("command_id"), item.get("node", node)
        if not isinstance(cid, str) or not cid or for_node != node:
            continue
        action, target = item.get("action"), item.get("target")
        out.append(NamedCommand(cid, action if isinstance(action, str) else "",
                                target if isinstance(target, str) else ""))
    return out
