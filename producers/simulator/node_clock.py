"""A node's simulated clock: an offset, a slowly wandering drift, and timestamp noise.

Ground truth: `local(true_ns)` is the noiseless reading of the clock at a true
time and `offset_at(true_ns)` = local - true. `stamp()` adds the timestamp
noise a real host adds and is what the simulator reports.

The drift is piecewise linear between knots one true second apart and follows
a random walk (reflected inside ±max_drift); the offset is its integral, so
offset and drift are continuous and any time can be queried, in any order.
Knots are drawn lazily, in order, from the clock's own generator, so the
answers do not depend on the order of queries.
"""

from __future__ import annotations

import random
from functools import cache

KNOT_NS = 1_000_000_000
NOISE_BITS = 12


@cache
def _noise_table(std_ns: float) -> tuple[float, ...]:
    """Gaussian noise samples, shared by all clocks with the same noise (picked per stamp at random)."""
    rng = random.Random(f"noise:{std_ns}")
    return tuple(rng.gauss(0.0, std_ns) for _ in range(2**NOISE_BITS))


class NodeClock:
    """The clock of one node, relative to simulated true time."""

    def __init__(self, node: str, start_ns: int, offset_ns: float, drift_ppm: float, *,
                 wander_ppb_per_s: float = 3.0, noise_ns: float = 20.0, max_drift_ppm: float = 30.0,
                 seed: int | str = 0) -> None:
        if abs(drift_ppm) > max_drift_ppm:
            raise ValueError(f"drift {drift_ppm} ppm is outside ±{max_drift_ppm} ppm")
        self.node = node
        self.start_ns = start_ns
        self.offset0_ns = float(offset_ns)
        self.drift0_ppm = float(drift_ppm)
        self.wander_ppb_per_s = wander_ppb_per_s
        self.noise_ns = noise_ns
        self.max_drift = max_drift_ppm * 1e-6
        self._rng = random.Random(f"clock:{seed}:{node}")
        self._drift = [drift_ppm * 1e-6]          # drift (ns/ns) at knot k
        self._cum = [self.offset0_ns]             # offset (ns) at knot k
        self._noise = _noise_table(float(noise_ns))

    def _extend(self, knots: int) -> None:
        step = self.wander_ppb_per_s * 1e-9
        lim = self.max_drift
        drift, cum, gauss = self._drift, self._cum, self._rng.gauss
        while len(drift) < knots:
            d0 = drift[-1]
            d1 = d0 + gauss(0.0, step)
            if d1 > lim:
                d1 = 2 * lim - d1
            elif d1 < -lim:
                d1 = -2 * lim - d1
            cum.append(cum[-1] + 0.5 * (d0 + d1) * KNOT_NS)
            drift.append(d1)

    def offset_ns(self, true_ns: int) -> float:
        """The exact offset (local - true) in ns at a true time, as a float."""
        dt = true_ns - self.start_ns
        if dt <= 0:
            return self.offset0_ns + self._drift[0] * dt
        k = dt // KNOT_NS
        if k + 1 >= len(self._drift):
            self._extend(k + 2)
        x = dt - k * KNOT_NS
        d0 = self._drift[k]
        return self._cum[k] + d0 * x + (self._drift[k + 1] - d0) * x * x / (2 * KNOT_NS)

    def offset_at(self, true_ns: int) -> int:
        """Ground truth: local - true, in whole ns, at a true time."""
        return round(self.offset_ns(true_ns))

    def local(self, true_ns: int) -> int:
        """Ground truth: what this clock reads (without noise) at a true time."""
        return true_ns + round(self.offset_ns(true_ns))

    def drift_ppm_at(self, true_ns: int) -> float:
        """Ground truth: the clock's rate error at a true time, in ppm (positive = runs fast)."""
        dt = true_ns - self.start_ns
        if dt <= 0:
            return self._drift[0] * 1e6
        k = dt // KNOT_NS
        if k + 1 >= len(self._drift):
            self._extend(k + 2)
        x = (dt - k * KNOT_NS) / KNOT_NS
        return (self._drift[k] + (self._drift[k + 1] - self._drift[k]) * x) * 1e6

    def to_true(self, local_ns: int) -> int:
        """The true time at which this clock read `local_ns` (noise aside)."""
        t = local_ns - round(self.offset_ns(local_ns))
        t = local_ns - round(self.offset_ns(t))
        return local_ns - round(self.offset_ns(t))

    def stamp(self, true_ns: int, rng: random.Random) -> int:
        """A reported timestamp: the local reading at `true_ns` plus timestamp noise.

        The noise is drawn with the caller's generator, so each producer's
        stream stays reproducible on its own. (Hot path: `offset_ns` inlined.)
        """
        dt = true_ns - self.start_ns
        k = dt // KNOT_NS
        drift = self._drift
        if dt <= 0 or k + 1 >= len(drift):
            return true_ns + round(self.offset_ns(true_ns) + self._noise[rng.getrandbits(NOISE_BITS)])
        x = dt - k * KNOT_NS
        d0 = drift[k]
        off = self._cum[k] + d0 * x + (drift[k + 1] - d0) * x * x / (2 * KNOT_NS)
        return true_ns + round(off + self._noise[rng.getrandbits(NOISE_BITS)])

    def __repr__(self) -> str:
        return (f"NodeClock({self.node!r}, offset0={self.offset0_ns / 1e3:.1f} µs, "
                f"drift0={self.drift0_ppm:.2f} ppm)")
