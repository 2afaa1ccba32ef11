"""What one clock-probe agent is told: its node, key, bind, peers and rates, checked when it is built.

The checks raise ValueError with a message a user can act on (a bad name, a short key, a rate out of
range, a wildcard bind not asked for, no route to the first peer): `python -m clocktower.producers.clock.probe_agent`
prints it, and the node agent's clock source reports itself off with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from clocktower.producers.clock.endpoints import default_bind, is_wildcard, parse_endpoint
from clocktower.producers.clock.key import MIN_KEY_BYTES
from clocktower.producers.clock.timestamping import Mode
from clocktower.producers.clock.wire import MAX_NAME_BYTES


@dataclass(frozen=True)
class ProbeAgentConfig:
    node: str
    key: bytes = field(repr=False)        # the cluster's clock key (see `key`): every datagram is MACed with it
    bind: str | None = None               # None: on the cluster interface (see `endpoints.default_bind`)
    peers: tuple[str, ...] = ()           # the only sources accepted, and the only addresses probed back
    probe_peers: int = 10                 # K
    pairs_per_s: float = 10.0             # R, per peer
    pair_spacing_us: float = 10.0         # s; 0 sends both probes with one sendmmsg, back to back
    timestamping: Mode = "software"
    interface: str | None = None          # the NIC, for hardware timestamping
    flush_interval_s: float = 0.5
    max_batch: int = 1000
    tx_timeout_s: float = 1.0             # how long to wait for the kernel's TX timestamps
    join_timeout_s: float = 2.0           # how long the responder keeps half-joined pairs
    purity_tolerance_ns: int = 2_000
    warm_up: bool = True                  # a WARM_UP datagram just before each pair (see the module docstring)
    probe_back: bool = True               # probe every node that probes us (see the module docstring)
    max_probed_back: int = 64             # bound on peers added by probe-back at any time
    probe_back_expiry_s: float = 10.0     # a probed-back node silent this long is dropped
    seed: int | None = None               # peer choice and phases, for reproducible tests
    allow_any_bind: bool = False          # a wildcard bind (0.0.0.0, ::) only when asked for
    replay_window_s: float = 30.0         # datagrams stamped further than this from our clock are dropped
    max_datagrams_per_s: float | None = None     # per source; None: 8 x pairs_per_s + 20 (a peer sends ~4)
    max_pending_per_sender: int | None = None    # half-joined pairs per sender; None: from the rate and timeout

    def __post_init__(self) -> None:
        if not self.node or len(self.node.encode()) > MAX_NAME_BYTES:
            raise ValueError(f"node name must be 1..{MAX_NAME_BYTES} UTF-8 bytes, got {self.node!r}")
        if not isinstance(self.key, bytes) or len(self.key) < MIN_KEY_BYTES:
            raise ValueError(f"the clock key must be at least {MIN_KEY_BYTES} bytes")
        checks = [(self.probe_peers >= 0, "probe_peers must be >= 0"),
                  (0 < self.pairs_per_s <= 10_000, "pairs_per_s must be in (0, 10000]"),
                  (0 <= self.pair_spacing_us <= 1000, "pair_spacing_us must be in [0, 1000]"),
                  (self.flush_interval_s > 0, "flush_interval_s must be > 0"),
                  (self.max_batch >= 1, "max_batch must be >= 1"),
                  (self.tx_timeout_s > 0, "tx_timeout_s must be > 0"),
                  (self.join_timeout_s > 0, "join_timeout_s must be > 0"),
                  (self.purity_tolerance_ns >= 0, "purity_tolerance_ns must be >= 0"),
                  (self.max_probed_back >= 0, "max_probed_back must be >= 0"),
                  (self.probe_back_expiry_s > 0, "probe_back_expiry_s must be > 0"),
                  (self.replay_window_s > 0, "replay_window_s must be > 0"),
                  (self.max_datagrams_per_s is None or self.max_datagrams_per_s > 0,
                   "max_datagrams_per_s must be > 0"),
                  (self.max_pending_per_sender is None or self.max_pending_per_sender >= 1,
                   "max_pending_per_sender must be >= 1")]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        if self.bind is None:
            object.__setattr__(self, "bind", default_bind(self.peers, self.interface))
        family, address = parse_endpoint(self.bind_address, what="bind", allow_port_zero=True)
        if is_wildcard(address) and not self.allow_any_bind:
            raise ValueError(f"bind {self.bind} would accept probes on every interface: bind the cluster "
                             f"interface's address, or allow it explicitly (--clock-bind-any)")
        for peer in self.peers:
            parse_endpoint(peer, family)

    @property
    def bind_address(self) -> str:
        """The host:port bound (resolved from the peers and interface when `bind` was not given)."""
        assert self.bind is not None
        return self.bind

    @property
    def datagrams_per_s(self) -> float:
        """Per-source cap: a peer at our rate sends ~4 datagrams per pair (warm-up, 2 probes, follow-up)."""
        return self.max_datagrams_per_s or 8 * self.pairs_per_s + 20

    @property
    def pending_per_sender(self) -> int:
        """Half-joined pairs kept per sender: 4x what one at our rate has in flight within join_timeout_s."""
        return self.max_pending_per_sender or max(64, round(4 * self.pairs_per_s * self.join_timeout_s))
