"""The clock-probe agent: kernel-timestamped UDP probe pairs for Huygens-style clock sync.

- `wire`          the probe, follow-up and warm-up datagrams, each with a MAC under the cluster key
- `key`           the cluster key file: generated once (0600), checked on every load
- `replay`        per-sender stamps that only grow, and the receiver's replay guard
- `admission`     which received datagrams are handled: listed source, MAC, replay, per-source rate
- `rate_limit`    the token bucket behind the per-source rate
- `endpoints`     host:port parsing and the default bind on the cluster interface
- `timestamping`  the socket layer: SO_TIMESTAMPING options, NIC capabilities, control-message parsing
- `config`        ProbeAgentConfig: what one agent is told, checked when it is built
- `probe_agent`   the prober/responder loops, emitting ClockProbe events to a sink; `python -m` runs one agent
- `cli`           the command line of `python -m clocktower.producers.clock.probe_agent`

Nothing is imported here eagerly, so `python -m clocktower.producers.clock.probe_agent` runs cleanly.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "PairIds": "probe_agent", "ProbeAgent": "probe_agent", "ProbeAgentConfig": "config",
    "ProbeAgentError": "probe_agent", "parse_endpoint": "probe_agent",
    "TimestampedSocket": "timestamping", "TimestampingError": "timestamping", "TimestampingModes": "timestamping",
    "nic_timestamping": "timestamping",
    "ClockKeyError": "key", "generate_key_file": "key", "load_key": "key",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"clocktower.producers.clock.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'clocktower.producers.clock' has no attribute {name!r}")
