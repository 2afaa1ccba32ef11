"""Huygens-style clock sync (streams/clocksync) on small synthetic traces with known clocks."""

from __future__ import annotations

import numpy as np
import pytest

from clocktower.schemas.analytics import ClockEstimate
from clocktower.schemas.telemetry import ClockProbe
from clocktower.streams.clocksync import ClockSynchronizer
from clocktower.streams.clocksync.network_effect import solve_network
from clocktower.streams.clocksync.probe_filter import ProbePairFilter

T0 = 1_780_000_000 * 10**9
S = 10**9
UPDATE = S // 4


class Trace:
    """Coded probe pairs over a small graph; theta_i(t) = offset + drift * t (+ an optional step)."""

    def __init__(self, nodes: int = 8, seconds: float = 4.0, rate: float = 100.0, noise_ns: float = 5.0,
                 queued: float = 0.3, seed: int = 3, edges: list[tuple[int, int]] | None = None) -> None:
        rng = np.random.default_rng(seed)
        self.rng = rng
        self.names = [f"node-{i}" for i in range(nodes)]
        self.offset = rng.uniform(-500_000.0, 500_000.0, nodes)
        self.drift = rng.uniform(-20e-6, 20e-6, nodes)
        self.step_node, self.step_at, self.step_ns = -1, np.inf, 0.0
        self.edges = edges or [(a, b) for a in range(nodes) for b in range(a + 1, nodes)]
        self.seconds, self.rate, self.noise, self.queued = seconds, rate, noise_ns, queued
        self.alive = {i: (0.0, np.inf) for i in range(nodes)}    # true-time span a node probes in (s)

    def theta(self, node: np.ndarray, t: np.ndarray) -> np.ndarray:
        th = self.offset[node] + self.drift[node] * t
        return th + np.where((node == self.step_node) & (t >= self.step_at * S), self.step_ns, 0.0)

    def local(self, node: int, t: float) -> int:
        return T0 + round(t + float(self.theta(np.array([node]), np.array([t]))[0]))

    def true_offset(self, node: int, t: float) -> float:
        """Ground truth of ClockEstimate.offset_ns: node's clock minus node 0's."""
        th = self.theta(np.array([node, 0]), np.array([t, t]))
        return float(th[0] - th[1])

    def probes(self, t0: float, t1: float) -> dict[str, np.ndarray]:
        """Reports of the pairs sent in true time [t0, t1) s, both directions of every edge."""
        rng, rows = self.rng, []
        for e, (a, b) in enumerate(self.edges):
            for d, (s, r) in enumerate(((a, b), (b, a))):
                lo = max(t0, self.alive[s][0], self.alive[r][0])
                hi = min(t1, self.alive[s][1], self.alive[r][1])
                if hi <= lo:
                    continue
                k = np.arange(np.ceil(lo * self.rate), np.ceil(hi * self.rate)).astype(np.int64)
                ts = (k + rng.uniform(0, 0.5, k.size)) / self.rate * S
                pid = (np.int64(e) << 40) + (np.int64(d) << 39) + k
                rows.append((np.full(k.size, s), np.full(k.size, r), pid.astype(np.uint64), ts))
        s, r, pid, ts = (np.concatenate(c) for c in zip(*rows, strict=True))
        n = ts.size
        out = {"sender": [], "receiver": [], "pair_id": [], "idx": [], "tx_ns": [], "rx_ns": []}
        for idx in (0, 1):
            t = ts + idx * 1_000.0
            q = np.where(rng.random(n) < self.queued, rng.exponential(2_000.0, n), 0.0)
            arr = t + 3_000.0 + q
            out["sender"].append(s)
            out["receiver"].append(r)
            out["pair_id"].append(pid)
            out["idx"].append(np.full(n, idx, dtype=np.int8))
            out["tx_ns"].append(T0 + np.rint(t + self.theta(s, t) + rng.normal(0, self.noise, n)).astype(np.int64))
            out["rx_ns"].append(T0 + np.rint(arr + self.theta(r, arr) + rng.normal(0, self.noise, n)).astype(np.int64))
        return {k: np.concatenate(v) for k, v in out.items()}


def feed(sync: ClockSynchronizer, tr: Trace, c: dict[str, np.ndarray]) -> None:
    sync.add_probes_arrays(c["sender"], c["receiver"], c["pair_id"], c["idx"], c["tx_ns"], c["rx_ns"], tr.names)


def run(sync: ClockSynchronizer, tr: Trace, until_s: float, start_s: float = 0.0, check=None) -> list:  # noqa: ANN001
    out = []
    k = round(start_s * S / UPDATE)
    while (k + 1) * UPDATE <= until_s * S:
        t0, t1 = k * UPDATE / S, (k + 1) * UPDATE / S
        feed(sync, tr, tr.probes(t0, t1))
        out = sync.update(tr.local(0, t1 * S + 100_000))
        if check is not None:
            check(t1, out)
        k += 1
    return out


def conversion_error(sync: ClockSynchronizer, tr: Trace, node: int, t_s: float) -> tuple[float, int]:
    got = sync.to_reference(tr.names[node], tr.local(node, t_s * S))
    assert got is not None, f"no estimate for {tr.names[node]}"
    return got[0] - tr.local(0, t_s * S), got[1]


def test_recovers_known_offsets_and_drifts_within_10ns() -> None:
    tr = Trace()
    sync = ClockSynchronizer()
    est = run(sync, tr, 4.0)
    assert sync.reference == "node-0"
    by = {e.node: e for e in est}
    assert set(by) == set(tr.names)
    t_now = 4.0 * S + 100_000
    for i, name in enumerate(tr.names):
        e = by[name]
        assert abs(e.offset_ns - tr.true_offset(i, t_now)) <= 10, name
        assert abs(e.drift_ppb - (tr.drift[i] - tr.drift[0]) * 1e9) <= 10, name
        err, bound = conversion_error(sync, tr, i, 4.1)
        assert abs(err) <= 10 and abs(err) <= bound, (name, err, bound)
    assert by["node-0"].offset_ns == 0 and by["node-0"].error_bound_ns == 0


def test_to_reference_is_none_before_any_estimate_and_converts_after() -> None:
    tr = Trace(nodes=4)
    sync = ClockSynchronizer()
    assert sync.to_reference("node-1", T0) is None
    assert sync.update(T0) == []
    feed(sync, tr, tr.probes(0.0, 0.1))
    sync.update(tr.local(0, 0.1 * S))           # too little data yet (min_span 0.25 s)
    assert sync.to_reference("node-1", T0) is None
    run(sync, tr, 2.0, start_s=0.25)
    assert sync.to_reference("nobody", T0) is None
    for i in range(4):
        err, bound = conversion_error(sync, tr, i, 2.05)
        assert abs(err) <= 10 and bound >= abs(err)
    # the reference converts to itself exactly
    assert sync.to_reference("node-0", T0 + 123) == (T0 + 123, 0)
    # a timestamp from the past is converted with the estimate whose window covered it
    err, _ = conversion_error(sync, tr, 3, 1.2)
    assert abs(err) <= 10


def test_robust_to_reordered_lost_and_duplicated_probes() -> None:
    tr = Trace(seed=5)
    sync = ClockSynchronizer()
    rng = np.random.default_rng(9)
    held: dict[str, np.ndarray] | None = None
    replay: dict[str, np.ndarray] = {}
    for k in range(16):
        c = tr.probes(k / 4, (k + 1) / 4)
        n = c["idx"].size
        keep = rng.random(n) > 0.2                            # 20 % of the probes lost
        dup = rng.random(n) < 0.1                             # 10 % reported twice
        sel = np.r_[np.flatnonzero(keep), np.flatnonzero(keep & dup)]
        sel = sel[rng.permutation(sel.size)]                  # any order
        c = {k2: v[sel] for k2, v in c.items()}
        if held is not None:                                  # a quarter of each batch arrives one update late
            c = {k2: np.r_[v, held[k2]] for k2, v in c.items()}
        late = rng.random(c["idx"].size) < 0.25
        held = {k2: v[late] for k2, v in c.items()}
        feed(sync, tr, {k2: v[~late] for k2, v in c.items()})
        if k == 4:
            replay = {k2: v.copy() for k2, v in c.items()}
        if k == 10:                                           # a whole earlier batch replayed
            feed(sync, tr, replay)
        sync.update(tr.local(0, (k + 1) / 4 * S + 100_000))
    st = sync.stats
    assert st["duplicates"] > 0 and st["replayed_pairs"] > 0 and st["edge_resets"] == 0
    for i in range(len(tr.names)):
        err, bound = conversion_error(sync, tr, i, 4.05)
        assert abs(err) <= 10 and abs(err) <= bound


def test_clock_step_is_detected_and_the_node_recovers_within_a_window() -> None:
    tr = Trace(seed=7)
    tr.step_node, tr.step_at, tr.step_ns = 3, 2.0, 1_000_000.0      # node-3 jumps 1 ms ahead at 2 s
    sync = ClockSynchronizer()

    def check(t: float, est: list[ClockEstimate]) -> None:
        by = {e.node: e for e in est}
        for i, name in enumerate(tr.names):
            if t < 1.0 or (i == 3 and 2.0 <= t < 2.75):
                continue                                          # node-3 may be missing right after its step
            assert name in by, (t, name)
            assert abs(by[name].offset_ns - tr.true_offset(i, t * S + 100_000)) <= 15, (t, name)

    run(sync, tr, 5.0, check=check)
    assert sync.stats["edge_resets"] >= len(tr.names) - 1
    err, bound = conversion_error(sync, tr, 3, 5.05)
    assert abs(err) <= 10 and abs(err) <= bound


def test_nodes_joining_and_leaving() -> None:
    tr = Trace(nodes=7, seed=11)
    tr.alive[5] = (2.0, np.inf)      # joins at 2 s
    tr.alive[6] = (0.0, 2.0)         # leaves at 2 s
    sync = ClockSynchronizer()
    est = run(sync, tr, 1.75)
    assert "node-5" not in {e.node for e in est} and "node-6" in {e.node for e in est}
    est = run(sync, tr, 3.0, start_s=1.75)             # ~1 s later: the newcomer is in, the leaver is held over
    by = {e.node: e for e in est}
    assert by["node-5"].held_ns == 0 and by["node-6"].held_ns > 0   # (a leaver looks like a node whose probes
    assert abs(by["node-6"].offset_ns - tr.true_offset(6, 3 * S)) <= by["node-6"].error_bound_ns   # all queue)
    err, _ = conversion_error(sync, tr, 5, 3.05)
    assert abs(err) <= 15
    est = run(sync, tr, 3.0 + sync.solver.holdover_ns / S, start_s=3.0)   # past the hold-over: the leaver is out
    assert "node-6" not in {e.node for e in est}
    assert sync.to_reference("node-6", T0 + 14 * S) is None


def test_reference_leaving_hands_over_to_the_next_smallest_node() -> None:
    tr = Trace(nodes=5, seed=19)
    tr.alive[0] = (0.0, 1.5)
    sync = ClockSynchronizer()
    run(sync, tr, 1.5)
    assert sync.reference == "node-0"
    est = run(sync, tr, 4.0, start_s=1.5)
    assert sync.reference == "node-1" and {e.node for e in est} == {"node-1", "node-2", "node-3", "node-4"}
    t = 4.0 * S + 100_000
    for e in est:
        i = tr.names.index(e.node)
        assert abs(e.offset_ns - (tr.true_offset(i, t) - tr.true_offset(1, t))) <= 10


def test_forgotten_edges_are_compacted_and_the_rest_stay_right() -> None:
    tr = Trace(nodes=12, seed=23)                     # 66 edges; then half the nodes leave
    for i in range(6, 12):
        tr.alive[i] = (0.0, 1.0)
    sync = ClockSynchronizer(holdover_ns=S)           # the leavers' estimates are held 1 s, then dropped
    run(sync, tr, 4.0)
    assert sync.fitter.edges_registered == 15         # only the 15 edges among nodes 0..5 are left
    assert sync.nodes == tr.names[:6]
    for i in range(6):
        err, bound = conversion_error(sync, tr, i, 4.05)
        assert abs(err) <= 10 and abs(err) <= bound


def test_disconnected_nodes_get_no_estimate_and_a_fixed_reference_is_kept() -> None:
    tr = Trace(nodes=6, edges=[(0, 1), (1, 2), (0, 2), (3, 4), (4, 5), (3, 5)], seed=13)
    sync = ClockSynchronizer(reference="node-1")
    est = run(sync, tr, 2.0)
    assert {e.node for e in est} == {"node-0", "node-1", "node-2"}
    assert all(e.reference == "node-1" for e in est)
    assert sync.to_reference("node-4", T0) is None
    absent = ClockSynchronizer(reference="node-9")
    assert run(absent, tr, 1.0) == []


def test_estimates_validate_against_the_schema_and_probe_objects_work() -> None:
    tr = Trace(nodes=4, seed=17)
    sync = ClockSynchronizer()
    for k in range(8):
        c = tr.probes(k / 4, (k + 1) / 4)
        for i in range(c["idx"].size):
            s, r = tr.names[c["sender"][i]], tr.names[c["receiver"][i]]
            sync.add_probe(ClockProbe(node=r, ts_ns=int(c["rx_ns"][i]), pair_id=int(c["pair_id"][i]),
                                      idx=int(c["idx"][i]), sender=s, receiver=r, tx_ns=int(c["tx_ns"][i]),
                                      rx_ns=int(c["rx_ns"][i])))
        est = sync.update(tr.local(0, (k + 1) / 4 * S))
    assert len(est) == 4
    for e in est:
        again = ClockEstimate.model_validate(e.model_dump())
        assert again == e and e.reference == "node-0" and e.error_bound_ns >= 0
        assert sync.estimate(e.node) == e
    err, _ = conversion_error(sync, tr, 2, 2.05)
    assert abs(err) <= 10


def test_probe_filter_matches_pairs_and_keeps_the_pure_ones() -> None:
    f = ProbePairFilter(tolerance_ns=50, max_age_ns=S)
    #           sender receiver pid idx tx            rx
    rows = [(0, 1, 7, 1, T0 + 1_000, T0 + 6_020),        # second half first
            (0, 1, 7, 0, T0, T0 + 5_000),
            (0, 1, 7, 0, T0, T0 + 5_000),                # duplicate
            (0, 1, 8, 0, T0, T0 + 5_000),                # queued: spacing 1000 -> 3000
            (0, 1, 8, 1, T0 + 1_000, T0 + 8_000),
            (2, 1, 7, 0, T0, T0 + 4_000),                # same pair id, other sender: another pair
            (0, 1, 9, 0, T0, T0 + 5_000)]                # partner not here yet
    f.push(*(np.array(c) for c in zip(*rows, strict=True)))
    pp = f.pop(T0)
    assert list(pp.pair_id) == [7] and list(pp.sender) == [0] and int(pp.spacing_error[0]) == 20
    assert f.stats.duplicates == 1 and f.stats.pairs == 2 and f.stats.pure == 1
    assert f.pending["pair_id"].size == 2
    f.push(*(np.array([c]) for c in (0, 1, 9, 1, T0 + 1_000, T0 + 6_000)))
    assert list(f.pop(T0).pair_id) == [9]
    f.pop(T0 + 10 * S)                                  # the lone half of pair (2, 7) expires
    assert f.pending["pair_id"].size == 0 and f.stats.expired == 1


def test_network_effect_spreads_loop_surplus_and_ignores_other_components() -> None:
    # triangle 0-1-2 whose measured offsets sum to 3 ns around the loop; node 3 is in another component
    lo, hi = np.array([0, 1, 0, 3]), np.array([1, 2, 2, 4])
    m = np.array([10.0, 20.0, 27.0, 5.0])
    var = np.ones(4)
    sol = solve_network(5, lo, hi, m, var, np.zeros(4), var, reference=0)
    assert list(sol.nodes) == [0, 1, 2]
    x = dict(zip(sol.nodes.tolist(), sol.offset, strict=True))
    assert x[0] == 0.0
    assert x[1] == pytest.approx(9.0) and x[2] == pytest.approx(28.0)    # 1 ns moved onto each edge
    assert all(s > 0 for s in sol.offset_std[1:])
