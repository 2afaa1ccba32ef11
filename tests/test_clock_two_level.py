"""Clock sync in two levels, as a multi-worker deployment runs it: probes split by edge over several
EdgeFitters, their ClockEdgeFit summaries (through the codec) into one NetworkSolver, its ClockEstimates
into a ClockView that knows nothing else."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from clocktower.schemas.analytics import ClockEdgeFit, ClockEstimate
from clocktower.schemas.codec import decode_batch, encode_batch
from clocktower.schemas.topics import topic_for
from clocktower.streams.clocksync import ClockSynchronizer, laplacian
from clocktower.streams.clocksync.clock_view import ClockView
from clocktower.streams.clocksync.edge_fitter import EdgeFitter
from clocktower.streams.clocksync.network_solver import NetworkSolver
from tests.test_clocksync import T0, UPDATE, S, Trace, conversion_error, feed

FITTERS = 3


def _wire(events: list, model: type) -> list:
    """Through the Kafka codec, one record per node (the record key), as the topics carry them."""
    by_node: dict[str, list] = defaultdict(list)
    for e in events:
        by_node[e.node].append(e)
    out = []
    for node_events in by_node.values():
        key, value, headers = encode_batch(node_events)
        out += decode_batch(topic_for(model).name, key, value, headers, now_ns=T0 + 10**6 * S).events
    return out


def _split(tr: Trace, c: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    """The probes routed by edge (min, max of the two ends), as the stream app partitions them."""
    lo, hi = np.minimum(c["sender"], c["receiver"]), np.maximum(c["sender"], c["receiver"])
    worker = (lo * 31 + hi) % FITTERS
    return [{k: v[worker == w] for k, v in c.items()} for w in range(FITTERS)]


def _feed_fitter(f: EdgeFitter, tr: Trace, c: dict[str, np.ndarray]) -> None:
    f.add_probes_arrays(c["sender"], c["receiver"], c["pair_id"], c["idx"], c["tx_ns"], c["rx_ns"], tr.names)


def _check_against(single: list[ClockEstimate], multi: list[ClockEstimate], tr: Trace, t_ns: float) -> None:
    """Same nodes; each offset within the single run's error bound of it, and of the truth within its own."""
    a, b = {e.node: e for e in single}, {e.node: e for e in multi}
    assert set(a) == set(b) == set(tr.names)
    for i, name in enumerate(tr.names):
        assert abs(b[name].offset_ns - a[name].offset_ns) <= a[name].error_bound_ns, name
        assert abs(b[name].offset_ns - tr.true_offset(i, t_ns)) <= b[name].error_bound_ns, name
        assert abs(b[name].drift_ppb - a[name].drift_ppb) <= 5 * max(a[name].drift_std_ppb, 0.1), name


def test_three_fitters_and_one_solver_match_the_single_synchronizer() -> None:
    tr = Trace(nodes=10, seed=29)
    single = ClockSynchronizer()
    fitters = [EdgeFitter() for _ in range(FITTERS)]
    solver, one_by_one = NetworkSolver(), NetworkSolver()
    per_fitter = [0] * FITTERS
    for k in range(16):
        c = tr.probes(k / 4, (k + 1) / 4)
        now = tr.local(0, (k + 1) * UPDATE + 100_000)
        feed(single, tr, c)
        want = single.update(now)
        fits = []
        for w, (f, part) in enumerate(zip(fitters, _split(tr, c), strict=True)):
            _feed_fitter(f, tr, part)
            out = f.update(now)
            per_fitter[w] = max(per_fitter[w], len(out))
            fits += out
        assert solver.add_fits(_wire(fits, ClockEdgeFit))        # a newer round: a solve is due
        for e in reversed(fits):                                  # one at a time, as a stream delivers them
            one_by_one.add_fits([e])
        got = solver.update(now)
        same = {e.node: e for e in one_by_one.update(now)}
        assert set(same) == {e.node for e in got} and all(
            abs(same[e.node].offset_ns + same[e.node].offset_frac_ns - e.offset_ns - e.offset_frac_ns) < 1e-6
            and same[e.node].error_bound_ns == e.error_bound_ns for e in got)
        if k >= 4:
            _check_against(want, got, tr, (k + 1) * UPDATE + 100_000)
    assert all(n > 0 for n in per_fitter) and sum(per_fitter) == len(tr.edges)   # every fitter held edges
    assert solver.reference == single.reference == "node-0"


def test_fits_arriving_late_are_extrapolated_to_the_solve() -> None:
    """Fitter 0 publishes first and triggers the solve; the other two's fits of that round come after it and
    are read by the next solve, a quarter second after their origin."""
    tr = Trace(nodes=10, seed=31)
    single = ClockSynchronizer()
    fitters = [EdgeFitter() for _ in range(FITTERS)]
    solver = NetworkSolver()
    solves = 0
    for k in range(20):
        c = tr.probes(k / 4, (k + 1) / 4)
        t_ns = (k + 1) * UPDATE + 100_000
        now = tr.local(0, t_ns)
        feed(single, tr, c)
        want = single.update(now)
        parts = _split(tr, c)
        for f, part in zip(fitters, parts, strict=True):
            _feed_fitter(f, tr, part)
        first = fitters[0].update(now)
        due = solver.add_fits(_wire(first, ClockEdgeFit))
        if due:
            got = solver.update(solver.latest_origin_ns)
            solves += 1
            if k >= 6:
                assert solver.latest_origin_ns == now
                _check_against(want, got, tr, t_ns)
        late = [e for f in fitters[1:] for e in f.update(now)]
        assert late and not solver.add_fits(_wire(late, ClockEdgeFit))    # the same round: not due again
    assert solves == 20


def test_view_fed_only_estimates_converts_like_the_synchronizer() -> None:
    tr = Trace(nodes=6, seed=37)
    sync = ClockSynchronizer()
    view = ClockView()
    for k in range(12):
        feed(sync, tr, tr.probes(k / 4, (k + 1) / 4))
        est = sync.update(tr.local(0, (k + 1) * UPDATE + 100_000))
        view.add_estimates(_wire(est, ClockEstimate))
    assert view.reference == sync.reference == "node-0" and view.nodes == sync.nodes == tr.names
    for i, name in enumerate(tr.names):
        for t_s in (1.1, 2.0, 2.7, 3.05, 3.6):                     # past estimates, the latest, the future
            local = tr.local(i, t_s * S)
            assert view.to_reference(name, local) == sync.to_reference(name, local), (name, t_s)
            err, bound = conversion_error(sync, tr, i, t_s)
            assert abs(err) <= bound and (t_s > 3.1 or abs(err) <= 10), (name, t_s, err, bound)
        assert view.estimate(name) == sync.estimate(name)


def test_view_follows_the_latest_solve_and_its_reference() -> None:
    def solve(ts: int, nodes: str, ref: str = "a", offset: int = 1_000) -> list[ClockEstimate]:
        return [ClockEstimate(node=n, ts_ns=ts, reference=ref, offset_ns=0 if n == ref else offset, drift_ppb=0.0,
                              error_bound_ns=0 if n == ref else 5, solve_nodes=len(nodes)) for n in nodes]

    view = ClockView()
    assert view.to_reference("b", T0) is None
    view.add_estimates(solve(T0, "abc"))
    assert view.to_reference("b", T0 + 1_000) == (T0, 5) and view.to_reference("a", T0 + 7) == (T0 + 7, 0)
    nxt = solve(T0 + S, "ab", offset=2_000)                    # c left
    view.add_estimates(nxt[1:])                                # the solve's records one by one: until all are in,
    assert view.nodes == ["a", "b", "c"] and view.to_reference("c", T0 + 1_000) == (T0, 5)   # the last one holds
    assert view.to_reference("b", T0 + S + 2_000)[0] == T0 + S  # b already uses its new estimate
    view.add_estimates(nxt[:1])
    assert view.to_reference("c", T0) is None and view.nodes == ["a", "b"] and view.latest_ns == T0 + S
    assert view.to_reference("b", T0 + 1_000)[0] == T0                           # the past: the estimate after it
    assert view.to_reference("b", T0 + S + 2_000)[0] == T0 + S                   # now: the latest
    view.add_estimates(solve(T0, "b"))                                           # a replayed old one: no change
    assert view.nodes == ["a", "b"] and view.latest_ns == T0 + S
    view.add_estimates(solve(T0 + 2 * S, "bc", ref="b"))                         # the reference changed
    assert view.reference == "b" and view.nodes == ["b", "c"] and view.to_reference("a", T0) is None
    assert view.to_reference("c", T0 + 2 * S + 1_000) == (T0 + 2 * S, 5)
    view.add_estimates(solve(T0 + S, "a"))                                       # an older solve's: ignored
    assert view.reference == "b" and view.to_reference("a", T0 + S) is None
    view.add_estimates(solve(T0 + 3 * S, "bcd", ref="b")[:2])                    # d's record lost: the next solve
    view.add_estimates(solve(T0 + 4 * S, "bc", ref="b")[:1])                     # supersedes it anyway
    assert view.latest_ns == T0 + 3 * S and view.nodes == ["b", "c"]


def test_edge_fits_name_their_ends_in_order_and_survive_the_codec() -> None:
    tr = Trace(nodes=4, seed=41)
    tr.names = ["zeta", "alpha", "mu", "beta"]                   # index order is not name order
    f = EdgeFitter()
    for k in range(6):
        _feed_fitter(f, tr, tr.probes(k / 4, (k + 1) / 4))
        fits = f.update(tr.local(0, (k + 1) * UPDATE))
    assert len(fits) == 6 and all(e.node < e.hi and e.valid and len(e.cov) == 16 for e in fits)
    assert {(e.node, e.hi) for e in fits} == {("alpha", "beta"), ("alpha", "mu"), ("alpha", "zeta"), ("beta", "mu"),
                                              ("beta", "zeta"), ("mu", "zeta")}
    assert sorted(_wire(fits, ClockEdgeFit), key=lambda e: e.hi) == sorted(fits, key=lambda e: e.hi)
    one_way = Trace(nodes=2, seed=43, edges=[(0, 1)])
    g = EdgeFitter()
    c = one_way.probes(0.0, 0.5)
    fwd = c["sender"] == 0
    _feed_fitter(g, one_way, {k: v[fwd] for k, v in c.items()})
    (fit,) = g.update(one_way.local(0, 0.5 * S))
    assert not fit.valid and fit.cov == [] and fit.t_last_rev_s is None and fit.t_last_fwd_s is not None
    assert _wire([fit], ClockEdgeFit) == [fit]                     # no infinity, no NaN: JSON carries it
    solver = NetworkSolver()
    solver.add_fits([fit])
    assert solver.update(one_way.local(0, 0.5 * S)) == [ClockEstimate(
        node="node-0", ts_ns=one_way.local(0, 0.5 * S), reference="node-0", offset_ns=0, drift_ppb=0.0,
        error_bound_ns=0, solve_nodes=1)]                           # present, but nothing usable yet


def test_sparse_solves_match_the_dense_inverse() -> None:
    """The solver's CG solves and Cholesky variances against a dense inverse, on a sparse random graph whose
    edge weights span six orders of magnitude (a few down-weighted edges among good ones)."""
    rng = np.random.default_rng(5)
    n = 300
    perm = [rng.permutation(n) for _ in range(4)]
    pairs = {(min(a, b), max(a, b)) for p in perm for a, b in zip(p, np.roll(p, -1), strict=True)}
    lo, hi = (np.array(c) for c in zip(*sorted(pairs), strict=True))
    w = 10.0 ** rng.uniform(-4, 2, lo.size)
    rhs = np.bincount(hi, w * rng.normal(0, 50, lo.size), n) - np.bincount(lo, w * rng.normal(0, 50, lo.size), n)
    cov = np.linalg.inv(laplacian.dense(n, lo, hi, w))
    want = np.r_[0.0, cov @ rhs[1:]]
    for guess in (None, want + rng.normal(0, 1, n)):
        got = laplacian.solve(n, lo, hi, w, rhs, guess)
        assert got[0] == 0.0 and np.allclose(got, want, rtol=1e-8, atol=1e-6 * np.abs(want).max())
    assert np.allclose(laplacian.inverse_diagonal(n, lo, hi, w), np.diag(cov), rtol=1e-9)


def test_the_view_does_not_stretch_an_old_estimate_over_a_gap() -> None:
    """A worker started after a stop reads the last estimates back: timestamps far from them stay unconverted."""
    ns = 1_000_000_000
    t = 1_780_000_000 * ns
    view = ClockView()
    view.add_estimates([ClockEstimate(node=n, ts_ns=t, reference="a", offset_ns=o, drift_ppb=50.0,
                                      error_bound_ns=5, solve_nodes=2) for n, o in (("a", 0), ("b", 1_000_000))])
    near = view.to_reference("b", t + 5 * ns + 1_000_000)
    assert near is not None and abs(near[0] - (t + 5 * ns)) < 1_000
    assert view.to_reference("b", t + 3600 * ns) is None
    assert view.to_reference("b", t - 3600 * ns) is None


def test_a_node_whose_every_probe_is_queued_is_held_over_with_a_wider_bound_then_dropped() -> None:
    """From 3 s on, node-4's probes are all lost to queueing (no pure pair): the solve no longer reaches it. Its
    estimate is carried forward along its drift, bound widened, still true within it; dropped after the hold-over."""
    tr = Trace(nodes=6, seed=37)
    fitter, solver = EdgeFitter(), NetworkSolver(holdover_ns=3 * S)
    cut = tr.names.index("node-4")
    held: list[ClockEstimate] = []
    for k in range(36):
        c = tr.probes(k / 4, (k + 1) / 4)
        if k >= 12:
            keep = (c["sender"] != cut) & (c["receiver"] != cut)
            c = {name: v[keep] for name, v in c.items()}
        t_ns = (k + 1) * UPDATE + 100_000
        _feed_fitter(fitter, tr, c)
        solver.add_fits(_wire(fitter.update(tr.local(0, t_ns)), ClockEdgeFit))
        got = {e.node: e for e in solver.update(tr.local(0, t_ns))}
        assert all(e.solve_nodes == len(got) for e in got.values())
        if k == 11:
            solved = got["node-4"]
            assert solved.held_ns == 0
        e = got.get("node-4")
        if k > 12 and e is not None and e.held_ns:
            held.append(e)
            assert e.error_bound_ns > solved.error_bound_ns
            assert abs(e.offset_ns + e.offset_frac_ns - tr.true_offset(cut, t_ns)) <= e.error_bound_ns
        if k >= 30:
            assert "node-4" not in got                                   # past the hold-over: dropped
        assert all(got[n].held_ns == 0 for n in got if n != "node-4")    # the others are still solved
    assert len(held) >= 6 and held[-1].held_ns > held[0].held_ns
