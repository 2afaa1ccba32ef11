"""Is one rank slower than it should be? Judged against its peers (median and MAD) and its own past (CUSUM).

A synchronous job runs at the pace of its slowest rank, so a rank's iteration time says nothing (everyone waits
for the straggler); its compute time does: the time not spent in collectives (iteration_breakdown.py). The
straggler computes longer, the others wait longer in their first collective.

- **Peers.** The rank's compute time against the median of every rank's in the same iteration (straggler.py judges
  an iteration once all its ranks are in), in units of the median
  absolute deviation (scaled by 1.4826, floored at `MAD_FLOOR` of the median so a job of identical ranks is not
  judged on nanoseconds). Slow: at least `min_excess` over the median and `min_z` MADs out. A fixed threshold
  alone would call every rank of a 2 %-jittery job slow some day; the MAD scales it to the job's own spread.
- **Its own past.** A one-sided CUSUM (Page, 1954) on the relative excess over the rank's own baseline (an EWMA of
  its healthy iterations): S = max(0, S + x - k). A change of +50 % crosses `h` in one iteration, +30 % in two;
  2 % noise never does. It makes a fresh slowdown count at once, where the peer test alone waits `sustain`
  iterations.

A rank is a straggler when it is peer-slow and either its CUSUM has crossed `h` (a change) or it has been
peer-slow for `sustain` iterations in a row (a rank slow since it started has no change to find). It recovers
after `sustain` iterations in a row under `min_excess / 2` over the median (hysteresis).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import median

MAD_SCALE = 1.4826     # MAD -> standard deviation for normal data
MAD_FLOOR = 0.005      # the MAD is at least this fraction of the median
EWMA_ALPHA = 0.1


@dataclass
class SlowdownRule:
    min_excess: float = 0.10    # at least 10 % over the peers' median
    min_z: float = 4.0          # and this many (scaled) MADs out
    cusum_k: float = 0.05       # CUSUM allowance: drift under 5 % is not accumulated
    cusum_h: float = 0.3        # CUSUM decision threshold
    sustain: int = 3            # iterations in a row: peer-slow to open without a change, healthy to resolve
    min_peers: int = 3          # fewer ranks than this: no peer judgement


@dataclass
class RankTrack:
    """What is kept of one rank."""

    baseline: float = 0.0       # EWMA of its healthy compute times, ns (0: none yet)
    cusum: float = 0.0
    slow_streak: int = 0
    healthy_streak: int = 0
    straggling: bool = False


@dataclass
class Verdict:
    excess: float        # (compute - peer median) / peer median
    z: float             # (compute - peer median) / scaled MAD
    peer_median: float
    peer_mad: float
    peers: int
    cusum: float
    slow: bool = False       # peer-slow with this iteration
    opened: bool = False     # the rank became a straggler with this iteration
    resolved: bool = False   # it recovered with this iteration
    evidence: dict = field(default_factory=dict)


def peer_stats(latest: list[float]) -> tuple[float, float]:
    """The median of the ranks' latest compute times, and their scaled MAD (floored)."""
    m = median(latest)
    mad = MAD_SCALE * median(abs(v - m) for v in latest)
    return m, max(mad, MAD_FLOOR * m)


def judge(track: RankTrack, compute_ns: float, latest: list[float], rule: SlowdownRule) -> Verdict | None:
    """Update `track` with one iteration's compute time; `latest` holds every rank's compute time of that iteration
    (this one's included). None when there are too few peers to judge."""
    if len(latest) < rule.min_peers:
        return None
    m, mad = peer_stats(latest)
    if m <= 0:
        return None
    excess = (compute_ns - m) / m
    z = (compute_ns - m) / mad
    peer_slow = excess >= rule.min_excess and z >= rule.min_z
    if track.baseline <= 0:
        track.baseline = compute_ns
    if track.baseline > 0:   # a rank whose compute time is 0 (collectives cover its iteration) has no own past yet
        x = compute_ns / track.baseline - 1.0
        track.cusum = max(0.0, track.cusum + x - rule.cusum_k)
    v = Verdict(excess, z, m, mad, len(latest), track.cusum, slow=peer_slow)
    if peer_slow:
        track.slow_streak += 1
        track.healthy_streak = 0
    else:
        track.slow_streak = 0
        track.healthy_streak = track.healthy_streak + 1 if excess < rule.min_excess / 2 else 0
        track.baseline += EWMA_ALPHA * (compute_ns - track.baseline)   # learn only from iterations not slow
    if not track.straggling and peer_slow and (track.cusum > rule.cusum_h or track.slow_streak >= rule.sustain):
        track.straggling, v.opened = True, True
        track.healthy_streak = 0
    elif track.straggling and track.healthy_streak >= rule.sustain:
        track.straggling, v.resolved = False, True
        track.cusum = 0.0
    if not track.straggling and not peer_slow:
        track.cusum = min(track.cusum, rule.cusum_h)   # a long healthy stretch cannot bank a later alarm
    return v
