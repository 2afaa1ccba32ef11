"""A publisher beside `up` signs with `up`'s producer key, found in its data dir.

`up` and `demo` make a producer key (producer.key in the data dir) and their streams act only on records signed by
the node they name. A process that the same user starts beside them without CLOCKTOWER_NODE_KEY (a training
script's Telemetry, the clock-probe CLI, `clocktower agent`) would otherwise publish unsigned records that those
streams dead-letter without a word. So when it publishes to a broker on this host (loopback) and the data dir
(CLOCKTOWER_DATA_DIR, default .clocktower) holds the key, it signs each record with the key of the node the record
is keyed by, derived from it. Anywhere else nothing is found, and a node is given CLOCKTOWER_NODE_KEY.
"""

from __future__ import annotations

import ipaddress
import logging
import os
from pathlib import Path

from pydantic import ValidationError

from clocktower.runtime.credentials import producer_key_path
from clocktower.runtime.settings import RuntimeSettings
from clocktower.schemas.record_mac import NodeSigning

log = logging.getLogger(__name__)


def _on_this_host(bootstrap: str) -> bool:
    """Every broker of `bootstrap` (host:port[,host:port]) is a loopback address or localhost."""
    for server in bootstrap.split(","):
        host = server.strip().rsplit(":", 1)[0].strip("[]")
        if host == "localhost":
            continue
        try:
            if not ipaddress.ip_address(host).is_loopback:
                return False
        except ValueError:
            return False
    return True


def local_producer_key(bootstrap: str) -> bytes | None:
    """`up`'s producer key when `bootstrap` is on this host and the data dir holds one, else None (a key file
    there that is unfit, e.g. readable by others, is named in a WARNING and not used)."""
    if not _on_this_host(bootstrap):
        return None
    # only the data dir is read here (all of RuntimeSettings would fail this publisher on an unrelated bad setting)
    data_dir = os.environ.get("CLOCKTOWER_DATA_DIR") or RuntimeSettings.model_fields["data_dir"].default
    path = producer_key_path(Path(data_dir))
    if not os.path.lexists(path):
        return None
    try:
        return NodeSigning(producer_key_file=path).producer_key_bytes()
    except ValidationError as exc:
        log.warning("records are sent unsigned: %s", "; ".join(e["msg"] for e in exc.errors()))
        return None
