"""The clock-probe agent: coded probe pairs to K peers, and the responder that reports what it receives.

Every agent does both jobs on one UDP socket (see `timestamping`):

- Prober. It picks K peers at random from its peer list and sends each one R
  probe pairs per second, at a random phase per peer. The two probes of a
  pair leave `pair_spacing_us` apart (a busy wait between the two sendto
  calls; 0 sends both with one sendmmsg); the spacing actually achieved is
  measured from the kernel's TX timestamps. When the kernel has reported both
  TX timestamps on the error queue, a FOLLOW_UP carrying them goes to the
  peer (two-step, as PTP's Follow_Up): a probe cannot carry its own kernel TX
  timestamp, which only exists once it has left.
- Warm-up. Just before each pair a small WARM_UP datagram goes to the same
  peer. At low probe rates the CPU has gone cold between pairs, and probe 0
  would otherwise pay for running the send and receive paths out of cold
  caches between its TX and RX timestamps while probe 1 runs them warm. On
  the 2-vCPU test VM at 50 pairs/s that made probe 0 ~3 us slower and left
  0-5 % of pairs pure; with the warm-up ~98 % are, and the achieved spacing
  fell from ~30 us to ~13 us (two sends) or ~7 us (sendmmsg).
- Probe-back. A node probed by a sender it does not probe itself adds that
  sender to its peers (up to `max_probed_back` of them), so every probed edge
  carries probes both ways: the estimator needs both directions to separate
  delay from offset, and each node still picks only K peers. A probed-back
  node that has not probed us for `probe_back_expiry_s` is dropped again (it
  left, or the source was spoofed). Only a host:port in the peer list is
  probed back, and never with more datagrams than it sent us (a credit of one
  datagram per datagram received, capped at about a second of probing), so a
  spoofed source gets no amplification.
- Who gets in. Every datagram carries a MAC with the cluster key, the sender
  name and a stamp that only grows (`wire`, `replay`). A datagram is handled
  only if it comes from a configured peer's IP, its MAC verifies, its stamp
  is fresh and new, and its source is within its rate (`admission`); anything
  else is counted in `stats()` and leaves no state. Half-joined pairs are
  bounded per sender as well as in total. The socket binds the cluster
  interface, never every interface unless asked (`endpoints`).
- Responder. It timestamps every probe on arrival (kernel RX timestamp),
  joins the probes of a pair with the sender's follow-up by (sender, pair_id)
  and emits one ClockProbe per probe, with tx_ns on the sender's clock and
  rx_ns (= ts_ns) on its own. Events go to `sink` in batches, from a thread
  of their own so that a slow sink never delays a probe; in production the
  sink is KafkaPublisher.publish.

A pair is "pure" (Huygens) when the receiver saw the same spacing as the
sender, |(rx1 - rx0) - (tx1 - tx0)| <= purity_tolerance_ns: neither probe was
queued behind other traffic. `stats()` reports the fraction.

pair_id: 64 bits = a random 16-bit agent prefix, drawn at every start, then a
48-bit counter that starts at the wall clock in microseconds and counts one per
pair. A restarted agent (new prefix, and a counter that starts past every id it
used before, as it never sends a pair per microsecond) cannot repeat its own
ids. Two agents repeat each other's ids only if they drew the same prefix
(1 in 65536) and their counter ranges overlap, i.e. they started within as many
microseconds of each other as pairs they sent. The receiver keys pairs by
(sender, pair_id) anyway, so even that does not mix up a join.

What the agent is told (and its checks) is `config.ProbeAgentConfig`; the command line is `cli.main`.
"""

from __future__ import annotations

import collections
import errno
import logging
import os
import queue
import random
import secrets
import select
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pydantic import ValidationError

from clocktower.producers.clock.admission import Admission
from clocktower.producers.clock.config import ProbeAgentConfig
from clocktower.producers.clock.endpoints import DEFAULT_PORT, format_endpoint, parse_endpoint
from clocktower.producers.clock.replay import SendClock
from clocktower.producers.clock.timestamping import TimestampedSocket, TimestampingError
from clocktower.producers.clock.wire import (
    MAX_FOLLOW_UP_ENTRIES,
    TX_SOURCES,
    FollowUp,
    FollowUpEntry,
    Probe,
    WarmUp,
    encode_follow_up,
    encode_probe,
    encode_warm_up,
)
from clocktower.schemas.telemetry import ClockProbe

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_PORT", "PairIds", "ProbeAgent", "ProbeAgentConfig", "ProbeAgentError", "main", "parse_endpoint"]
Sink = Callable[[list[ClockProbe]], object]

_MASK48 = (1 << 48) - 1
_FALLBACK_AFTER = 20          # datagrams without any kernel timestamp before falling back to userspace
_MAX_PENDING = 65_536         # half-joined pairs kept by the responder (bounds memory under garbage)
_DRAIN_LIMIT = 1024           # datagrams read per loop turn, per queue
_SPACING_SAMPLES = 4096
_CATCH_UP = 4                 # late pairs sent per peer per loop turn before the rest are skipped


class ProbeAgentError(RuntimeError):
    """The agent cannot run as configured (port in use, address not on this host, ...)."""


class PairIds:
    """64-bit pair ids, unique across agents and restarts (see the module docstring)."""

    def __init__(self, prefix: int | None = None, now_ns: int | None = None) -> None:
        self.prefix = secrets.randbits(16) if prefix is None else prefix
        if not 0 <= self.prefix < 1 << 16:
            raise ValueError(f"prefix must be 16 bits, got {self.prefix}")
        self._counter = ((time.time_ns() if now_ns is None else now_ns) // 1000) & _MASK48

    def next(self) -> int:
        pair_id = (self.prefix << 48) | self._counter
        self._counter = (self._counter + 1) & _MASK48
        return pair_id


@dataclass(slots=True, eq=False)
class _Peer:
    label: str
    address: tuple
    next_due_ns: int
    follow_ups: list[FollowUpEntry] = field(default_factory=list)
    reported_errnos: set[int] = field(default_factory=set)
    credit: int | None = None    # probed back: datagrams it sent us that we may still answer; None: no limit


@dataclass(slots=True, eq=False)
class _OutPair:                  # a pair sent, waiting for its TX timestamps
    pair_id: int
    peer: _Peer
    deadline_ns: int
    tx: list[int | None]
    keys: list[int | None]
    waiting: int


@dataclass(slots=True, eq=False)
class _InPair:                   # a pair being received, waiting for its probes and follow-up
    deadline_ns: int
    rx: list[int | None] = field(default_factory=lambda: [None, None])
    follow_up: FollowUpEntry | None = None


class ProbeAgent:
    """One node's clock-probe agent; `start()`, then `stop()` (or use it as a context manager)."""

    def __init__(self, config: ProbeAgentConfig, sink: Sink) -> None:
        self.config = config
        self.node = config.node
        self._sink = sink
        self._rng = random.Random(config.seed)
        self._ids = PairIds()
        self._key = config.key
        self._stamps = SendClock()
        self._family, self._bind = parse_endpoint(config.bind_address, what="bind", allow_port_zero=True)
        self._admission: Admission | None = None
        self._pending_by_sender: collections.Counter[str] = collections.Counter()
        self._sock: TimestampedSocket | None = None
        self._peers: list[_Peer] = []
        self._peer_addresses: set[tuple] = set()
        self._probed_back = 0
        self._back_seen: dict[tuple, int] = {}      # probed-back address -> when it last probed us
        self._next_back_check = 0
        self._out_pairs: dict[int, _OutPair] = {}
        self._tx_wait: dict[int, tuple[_OutPair, int]] = {}
        self._in_pairs: dict[tuple[str, int], _InPair] = {}
        self._batch: list[ClockProbe] = []
        self._queue: queue.Queue[list[ClockProbe] | None] = queue.Queue(maxsize=256)
        self._n: collections.Counter[str] = collections.Counter()
        self._spacing_tx: collections.deque[int] = collections.deque(maxlen=_SPACING_SAMPLES)
        self._spacing_user: collections.deque[int] = collections.deque(maxlen=_SPACING_SAMPLES)
        self._spacing_rx: collections.deque[int] = collections.deque(maxlen=_SPACING_SAMPLES)
        self._stopping = False
        self._wake = -1
        self._io: threading.Thread | None = None
        self._delivery: threading.Thread | None = None
        self._started_ns = 0
        self._address: tuple = ()
        self._modes: dict[str, object] | None = None
        self.failure: BaseException | None = None

    # -- lifecycle ------------------------------------------------------------------------------------------

    def start(self) -> ProbeAgent:
        if self._io is not None:
            raise ProbeAgentError("the agent was already started")
        try:
            self._sock = TimestampedSocket(self._bind, self._family, self.config.timestamping, self.config.interface)
        except TimestampingError:
            raise
        except OSError as exc:
            where = self.config.bind_address
            if exc.errno == errno.EADDRINUSE:
                raise ProbeAgentError(f"cannot bind UDP {where}: port already in use") from None
            if exc.errno == errno.EADDRNOTAVAIL:
                raise ProbeAgentError(f"cannot bind UDP {where}: address not on this host") from None
            raise ProbeAgentError(f"cannot bind UDP {where}: {exc.strerror or exc}") from None
        own = self._address = self._sock.getsockname()
        candidates: list[tuple[str, tuple]] = []
        try:
            for text in dict.fromkeys(self.config.peers):
                _, address = parse_endpoint(text, self._family)
                if address[:2] != own[:2]:                # never probe ourselves
                    candidates.append((text, address))
        except ValueError:
            self._sock.close()
            self._sock = None
            raise
        self._admission = Admission(self._key, [a for _, a in candidates], round(self.config.replay_window_s * 1e9),
                                    self.config.datagrams_per_s, self.config.datagrams_per_s, self._n)
        chosen = self._rng.sample(candidates, min(self.config.probe_peers, len(candidates)))
        period = self._period_ns()
        now = time.monotonic_ns()
        self._peers = [_Peer(label, address, now + self._rng.randrange(period)) for label, address in chosen]
        self._peer_addresses = {p.address[:2] for p in self._peers}
        self._started_ns = now
        self._wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._io = threading.Thread(target=self._run, name=f"clock-probe-io[{self.node}]", daemon=True)
        self._delivery = threading.Thread(target=self._deliver, name=f"clock-probe-sink[{self.node}]", daemon=True)
        self._delivery.start()
        self._io.start()
        log.info("clock-probe agent %s on %s probing %d peers at %.1f pairs/s each (spacing %.1f us)",
                 self.node, own, len(self._peers), self.config.pairs_per_s, self.config.pair_spacing_us)
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop probing, hand the last events to the sink, close the socket; idempotent."""
        if self._io is None or self._sock is None:
            return
        self._stopping = True
        os.eventfd_write(self._wake, 1)
        deadline = time.monotonic() + timeout
        self._io.join(max(0.0, deadline - time.monotonic()))
        if self._delivery is not None:
            self._delivery.join(max(0.0, deadline - time.monotonic()))
        if self._io.is_alive():
            log.warning("clock-probe io thread did not stop within %.1f s", timeout)
            return
        self._modes = self._sock.modes.as_dict()
        self._sock.close()
        self._sock = None
        os.close(self._wake)
        self._wake = -1

    def __enter__(self) -> ProbeAgent:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    @property
    def address(self) -> tuple:
        """The socket address bound (known once started)."""
        return self._address

    @property
    def peers(self) -> list[str]:
        return [p.label for p in self._peers]

    def _period_ns(self) -> int:
        return max(1, round(1e9 / self.config.pairs_per_s))

    # -- the io loop ----------------------------------------------------------------------------------------

    def _run(self) -> None:
        assert self._sock is not None
        poller = select.epoll()
        try:
            poller.register(self._sock.fileno(), select.EPOLLIN | select.EPOLLERR)
            poller.register(self._wake, select.EPOLLIN)
            flush_interval = round(self.config.flush_interval_s * 1e9)
            next_flush = time.monotonic_ns() + flush_interval
            while not self._stopping:
                now = time.monotonic_ns()
                self._send_due(now)
                if self._back_seen and now >= self._next_back_check:
                    self._next_back_check = now + 1_000_000_000
                    self._expire_probed_back()
                wake_at = min([next_flush, now + 100_000_000] + [p.next_due_ns for p in self._peers])
                for fd, _events in poller.poll(max(0.0, (wake_at - time.monotonic_ns()) / 1e9)):
                    if fd == self._wake:
                        os.eventfd_read(self._wake)
                self._drain_tx_timestamps()
                self._drain_received()
                now = time.monotonic_ns()
                self._expire(now)
                self._send_follow_ups()
                if now >= next_flush or len(self._batch) >= self.config.max_batch:
                    self._flush()
                    next_flush = now + flush_interval
            # Last TX timestamps and probes already queued in the kernel, then the last follow-ups.
            self._drain_tx_timestamps()
            self._drain_received()
            self._expire(time.monotonic_ns(), force_out=True)
            self._send_follow_ups()
        except BaseException as exc:
            self.failure = exc
            log.exception("clock-probe agent %s failed", self.node)
        finally:
            poller.close()
            self._flush()
            self._queue.put(None)

    def _send_due(self, now: int) -> None:
        period = self._period_ns()
        cost = 3 if self.config.warm_up else 2
        for peer in self._peers:
            for _ in range(_CATCH_UP):               # a few late pairs are sent now (poll wakes at ms granularity)
                if peer.next_due_ns > now:
                    break
                if peer.credit is None:
                    self._send_pair(peer)
                elif peer.credit >= cost:            # probe-back never sends more than the peer sent us
                    peer.credit -= cost
                    self._send_pair(peer)
                else:
                    self._n["probe_back_no_credit"] += 1
                peer.next_due_ns += period
            if peer.next_due_ns <= now:              # far behind (stalled): skip the missed pairs, do not burst
                self._n["pairs_skipped_late"] += (now - peer.next_due_ns) // period + 1
                peer.next_due_ns = now + period

    def _send_pair(self, peer: _Peer) -> None:
        sock = self._sock
        assert sock is not None
        pair_id = self._ids.next()
        spacing = round(self.config.pair_spacing_us * 1000)
        keys: list[int | None] = [None, None]
        user: list[int | None] = [None, None]
        started = [0, 0]
        # Everything is encoded (and MACed) first, so nothing slow runs between the warm-up and the pair.
        warm_up = encode_warm_up(WarmUp(self.node, self._stamps.stamp()), self._key) if self.config.warm_up else None
        payloads = (encode_probe(Probe(self.node, pair_id, 0, self._stamps.stamp()), self._key),
                    encode_probe(Probe(self.node, pair_id, 1, self._stamps.stamp()), self._key))
        if warm_up is not None:
            try:
                sock.send(warm_up, peer.address)
            except OSError as exc:
                self._send_failed(peer, exc)
                return
        if spacing == 0:                                 # both in one sendmmsg: back to back
            results = sock.send_pair(payloads, peer.address)
        else:
            results = []
            for idx, payload in enumerate(payloads):
                if idx == 1:
                    until = started[0] + spacing
                    while time.perf_counter_ns() < until:    # bounded by pair_spacing_us <= 1 ms
                        pass
                started[idx] = time.perf_counter_ns()
                try:
                    results.append(sock.send(payload, peer.address))
                except OSError as exc:
                    results.append(exc)
        for idx, result in enumerate(results):
            if isinstance(result, OSError):
                self._send_failed(peer, result)
            else:
                keys[idx], user[idx] = result
                self._n["probes_sent"] += 1
        if spacing and user[0] is not None and user[1] is not None:
            self._spacing_user.append(started[1] - started[0])
        if user[0] is None and user[1] is None:
            return
        self._n["pairs_sent"] += 1
        if sock.modes.tx == "userspace":
            peer.follow_ups.append(FollowUpEntry(pair_id, user[0], user[1]))
            return
        out = _OutPair(pair_id, peer, time.monotonic_ns() + round(self.config.tx_timeout_s * 1e9), [None, None],
                       keys, sum(k is not None for k in keys))
        self._out_pairs[pair_id] = out
        for idx, key in enumerate(keys):
            if key is not None:
                self._tx_wait[key] = (out, idx)

    def _send_failed(self, peer: _Peer, exc: OSError) -> None:
        self._n["send_errors"] += 1
        code = exc.errno or 0
        if code not in peer.reported_errnos:
            peer.reported_errnos.add(code)
            log.warning("cannot send clock probes to %s: %s", peer.label, exc.strerror or exc)

    def _drain_tx_timestamps(self) -> None:
        sock = self._sock
        assert sock is not None
        if sock.modes.tx == "userspace":
            return
        for key, ns in sock.recv_tx_timestamps(_DRAIN_LIMIT):
            waiting = self._tx_wait.pop(key, None)
            if waiting is None:
                continue                               # a follow-up's own timestamp, or one that came too late
            out, idx = waiting
            out.tx[idx] = ns
            out.waiting -= 1
            self._n["tx_timestamps"] += 1
            if out.waiting == 0:
                del self._out_pairs[out.pair_id]
                self._queue_follow_up(out)

    def _queue_follow_up(self, out: _OutPair) -> None:
        tx0, tx1 = out.tx
        if tx0 is not None and tx1 is not None:
            self._spacing_tx.append(tx1 - tx0)
        if tx0 is not None or tx1 is not None:
            out.peer.follow_ups.append(FollowUpEntry(out.pair_id, tx0, tx1))

    def _send_follow_ups(self) -> None:
        sock = self._sock
        assert sock is not None
        source = TX_SOURCES[sock.modes.tx]
        for peer in self._peers:
            while peer.follow_ups:
                chunk = tuple(peer.follow_ups[:MAX_FOLLOW_UP_ENTRIES])
                del peer.follow_ups[:MAX_FOLLOW_UP_ENTRIES]
                if peer.credit is not None:
                    peer.credit -= 1                   # owed for pairs already sent; may go below zero
                try:
                    payload = encode_follow_up(FollowUp(self.node, source, chunk, self._stamps.stamp()), self._key)
                    sock.send(payload, peer.address)
                    self._n["follow_ups_sent"] += 1
                except OSError as exc:
                    self._send_failed(peer, exc)

    def _drain_received(self) -> None:
        sock, admission = self._sock, self._admission
        assert sock is not None and admission is not None
        for _ in range(_DRAIN_LIMIT):
            got = sock.recv()
            if got is None:
                return
            data, address, rx_ns = got
            message = admission.admit(data, address)     # refused ones are counted and leave no state
            if message is None:
                continue
            if address[:2] in self._back_seen:
                self._earn_credit(address[:2])
            if isinstance(message, Probe):
                self._on_probe(message, rx_ns)
                self._maybe_probe_back(address)
            elif isinstance(message, WarmUp):
                self._n["warm_ups_received"] += 1
            else:
                self._on_follow_up(message)

    def _earn_credit(self, key: tuple) -> None:
        """A probed-back peer sent us one more datagram: we may send it one more (capped at ~1 s of ours)."""
        cap = max(16, round(4 * self.config.pairs_per_s))
        for peer in self._peers:
            if peer.credit is not None and peer.address[:2] == key:
                peer.credit = min(cap, peer.credit + 1)

    def _maybe_probe_back(self, address: tuple) -> None:
        key = address[:2]
        if key in self._back_seen:
            self._back_seen[key] = time.monotonic_ns()       # still probing us: keep probing it back
        if not self.config.probe_back or key in self._peer_addresses or key == self._address[:2]:
            return
        assert self._admission is not None
        if not self._admission.listed(key):                  # a listed IP, but not a listed host:port
            self._n["probe_back_unlisted"] += 1
            return
        self._expire_probed_back()
        if self._probed_back >= self.config.max_probed_back:
            self._n["probe_back_refused"] += 1
            return
        self._probed_back += 1
        self._back_seen[key] = time.monotonic_ns()
        self._peer_addresses.add(address[:2])
        label = format_endpoint(*address[:2])
        self._peers.append(_Peer(label, address, time.monotonic_ns() + self._rng.randrange(self._period_ns()),
                                 credit=1))           # the probe that got it here
        log.info("clock-probe agent %s probes %s back", self.node, label)

    def _expire_probed_back(self) -> None:
        """Stop probing back nodes that stopped probing us (gone, or a spoofed source) for `probe_back_expiry_s`."""
        limit = time.monotonic_ns() - round(self.config.probe_back_expiry_s * 1e9)
        gone = {k for k, t in self._back_seen.items() if t < limit}
        if not gone:
            return
        self._peers = [p for p in self._peers if p.address[:2] not in gone]
        for k in gone:
            del self._back_seen[k]
            self._peer_addresses.discard(k)
        self._probed_back -= len(gone)
        self._n["probe_back_expired"] += len(gone)

    def _in_pair(self, sender: str, pair_id: int) -> _InPair | None:
        key = (sender, pair_id)
        pair = self._in_pairs.get(key)
        if pair is None:
            if len(self._in_pairs) >= _MAX_PENDING:
                self._n["pending_overflow"] += 1
                return None
            if self._pending_by_sender[sender] >= self.config.pending_per_sender:
                self._n["pending_sender_overflow"] += 1     # one sender cannot fill the table for the others
                return None
            self._pending_by_sender[sender] += 1
            pair = self._in_pairs[key] = _InPair(time.monotonic_ns() + round(self.config.join_timeout_s * 1e9))
        return pair

    def _drop_in_pair(self, key: tuple[str, int]) -> None:
        del self._in_pairs[key]
        left = self._pending_by_sender[key[0]] - 1
        if left > 0:
            self._pending_by_sender[key[0]] = left
        else:
            del self._pending_by_sender[key[0]]

    def _on_probe(self, probe: Probe, rx_ns: int | None) -> None:
        self._n["probes_received"] += 1
        if rx_ns is None:
            self._n["rx_timestamp_missing"] += 1
            if self._n["rx_timestamps"] == 0 and self._n["rx_timestamp_missing"] >= _FALLBACK_AFTER:
                log.warning("the kernel gives no receive timestamps: falling back to userspace ones")
                assert self._sock is not None
                self._sock.fall_back_to_userspace_rx()
            return
        self._n["rx_timestamps"] += 1
        pair = self._in_pair(probe.sender, probe.pair_id)
        if pair is None:
            return
        if pair.rx[probe.idx] is not None:
            self._n["duplicates"] += 1
            return
        pair.rx[probe.idx] = rx_ns
        if pair.follow_up is not None:
            self._try_join(probe.sender, probe.pair_id, pair)

    def _on_follow_up(self, follow_up: FollowUp) -> None:
        self._n["follow_ups_received"] += 1
        for entry in follow_up.entries:
            pair = self._in_pair(follow_up.sender, entry.pair_id)
            if pair is None:
                continue
            if pair.follow_up is not None:
                self._n["duplicates"] += 1
                continue
            pair.follow_up = entry
            self._try_join(follow_up.sender, entry.pair_id, pair)

    def _try_join(self, sender: str, pair_id: int, pair: _InPair, partial: bool = False) -> None:
        entry = pair.follow_up
        assert entry is not None
        wanted = [idx for idx in (0, 1) if entry.tx(idx) is not None]
        if not partial and any(pair.rx[idx] is None for idx in wanted):
            return
        self._drop_in_pair((sender, pair_id))
        emitted = 0
        for idx in wanted:
            rx, tx = pair.rx[idx], entry.tx(idx)
            if rx is None or tx is None:
                continue
            try:
                self._batch.append(ClockProbe(node=self.node, ts_ns=rx, pair_id=pair_id, idx=idx, sender=sender,
                                              receiver=self.node, tx_ns=tx, rx_ns=rx))
                emitted += 1
            except ValidationError as exc:
                self._n["invalid_events"] += 1
                if self._n["invalid_events"] <= 10:
                    log.warning("dropping a clock probe from %s that does not validate: %s", sender, exc)
        self._n["events_emitted"] += emitted
        rx0, rx1 = pair.rx
        tx0, tx1 = entry.tx0_ns, entry.tx1_ns
        if emitted == 2 and rx0 is not None and rx1 is not None and tx0 is not None and tx1 is not None:
            self._n["pairs_joined"] += 1
            self._spacing_rx.append(rx1 - rx0)
            if rx1 > rx0 and tx1 > tx0 and abs((rx1 - rx0) - (tx1 - tx0)) <= self.config.purity_tolerance_ns:
                self._n["pure_pairs"] += 1

    def _expire(self, now: int, force_out: bool = False) -> None:
        sock = self._sock
        assert sock is not None
        while self._out_pairs:
            out = next(iter(self._out_pairs.values()))
            if out.deadline_ns > now and not force_out:
                break
            del self._out_pairs[out.pair_id]
            for idx, key in enumerate(out.keys):
                if key is not None and out.tx[idx] is None:
                    self._tx_wait.pop(key, None)
                    self._n["tx_timestamp_missing"] += 1
            self._queue_follow_up(out)
        if (sock.modes.tx != "userspace" and self._n["tx_timestamps"] == 0
                and self._n["tx_timestamp_missing"] >= _FALLBACK_AFTER):
            log.warning("the kernel returns no TX timestamps on this path: falling back to userspace ones "
                        "(clock_gettime before sendto)")
            sock.fall_back_to_userspace_tx()
            self._tx_wait.clear()
        while self._in_pairs:
            key, pair = next(iter(self._in_pairs.items()))
            if pair.deadline_ns > now:
                break
            if pair.follow_up is not None:
                self._n["probes_lost"] += sum(pair.rx[i] is None for i in (0, 1) if pair.follow_up.tx(i) is not None)
                self._try_join(key[0], key[1], pair, partial=True)
            else:
                self._drop_in_pair(key)
                self._n["probes_without_follow_up"] += sum(rx is not None for rx in pair.rx)

    def _flush(self) -> None:
        if not self._batch:
            return
        batch, self._batch = self._batch, []
        try:
            self._queue.put_nowait(batch)
        except queue.Full:
            self._n["events_dropped"] += len(batch)
            log.warning("clock-probe sink is behind: dropped %d events", len(batch))

    def _deliver(self) -> None:
        while True:
            batch = self._queue.get()
            if batch is None:
                return
            try:
                self._sink(batch)
                self._n["events_delivered"] += len(batch)
            except Exception:
                self._n["sink_errors"] += 1
                if self._n["sink_errors"] <= 10:
                    log.exception("clock-probe sink failed on a batch of %d events", len(batch))

    # -- reporting ------------------------------------------------------------------------------------------

    def stats(self) -> dict[str, object]:
        """A snapshot: timestamping modes, counters, achieved pair spacing, pure-pair fraction, rates."""
        counts = dict(self._n)
        elapsed = max(1e-9, (time.monotonic_ns() - self._started_ns) / 1e9) if self._started_ns else 0.0
        joined = counts.get("pairs_joined", 0)
        sock = self._sock
        return {
            "node": self.node,
            "address": list(self._address[:2]),
            "modes": sock.modes.as_dict() if sock is not None else self._modes,
            "peers": self.peers,
            "elapsed_s": round(elapsed, 3),
            "pairs_sent_per_s": round(counts.get("pairs_sent", 0) / elapsed, 1) if elapsed else 0.0,
            "counts": counts,
            "pending_pairs": len(self._in_pairs),
            "probed_back": self._probed_back,
            "pure_fraction": round(counts.get("pure_pairs", 0) / joined, 4) if joined else None,
            "spacing_tx_ns": _summary(self._spacing_tx),
            "spacing_user_ns": _summary(self._spacing_user),
            "spacing_rx_ns": _summary(self._spacing_rx),
        }


def _summary(samples: Sequence[int]) -> dict[str, float] | None:
    if not samples:
        return None
    ordered = sorted(samples)
    return {"n": len(ordered), "min": ordered[0], "p50": statistics.median(ordered),
            "p90": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))], "max": ordered[-1]}


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m clocktower.producers.clock.probe_agent`: the command line lives in `producers.clock.cli`."""
    from clocktower.producers.clock.cli import main as cli_main
    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
