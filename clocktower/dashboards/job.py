"""Job: how long iterations take, where the time goes, which ranks straggle and what the pipeline blames."""

from __future__ import annotations

from clocktower.dashboards.layout import Dashboard, Panel
from clocktower.dashboards.variables import JOB_IS, NODE_IS

DASHBOARD = Dashboard(
    uid="clocktower-job", title="clocktower: training jobs",
    question="Why was my job slow: which iterations, which ranks, compute or communication, and what was to blame?",
    variables=("cluster", "job", "node"),
    panels=(
        Panel("Iteration time and the job's baseline (ms)", f"""SELECT $__timeInterval(time) AS t, job,
  avg(duration_ns) / 1e6 AS iteration_ms, avg(baseline_ns) / 1e6 AS baseline_ms
FROM iteration_blame FINAL
WHERE $__timeFilter(time) AND {JOB_IS}
GROUP BY t, job ORDER BY t""", unit="ms",
              description="An iteration lasts as long as its slowest rank; the baseline is the job's recent median."),
        Panel("Straggler skew (iteration time / baseline)", f"""SELECT $__timeInterval(time) AS t, job, max(slowdown) AS worst, avg(slowdown) AS mean
FROM iteration_blame FINAL
WHERE $__timeFilter(time) AND {JOB_IS}
GROUP BY t, job ORDER BY t""", description="1 is on pace; 2 means an iteration took twice the baseline."),
        Panel("Compute vs communication per rank-iteration (ms)", f"""SELECT $__timeInterval(time) AS t, job,
  avg(compute_ns) / 1e6 AS compute_ms, avg(comm_ns) / 1e6 AS comm_ms
FROM iteration_breakdown FINAL
WHERE $__timeFilter(time) AND {JOB_IS} AND {NODE_IS}
GROUP BY t, job ORDER BY t""", unit="ms"),
        Panel("Per iteration: slowest rank vs median compute (ms; rollup)", f"""SELECT fromUnixTimestamp64Nano(min(first_start_ns)) AS t, job, max(max_duration_ns) / 1e6 AS slowest_rank_ms,
  quantilesTDigestMerge(0.5, 0.99)(compute_quantiles_ns)[1] / 1e6 AS median_compute_ms
FROM iteration_stats
WHERE {JOB_IS} AND day >= toStartOfDay($__fromTime) - INTERVAL 1 DAY
GROUP BY job, iteration
HAVING $__timeFilter(t)
ORDER BY t""", unit="ms", width=24,
              description="From the iteration_stats rollup: each iteration's slowest rank against its ranks' median "
                          "compute; the gap is the straggler's cost."),
        Panel("Slow iterations by blame", f"""SELECT $__timeInterval(time) AS t, toString(blame) AS cause, count() AS iterations
FROM iteration_blame FINAL
WHERE $__timeFilter(time) AND blame != 'none' AND {JOB_IS}
GROUP BY t, cause ORDER BY t""", description="link, congestion, gpu or host: what the blame detector found."),
        Panel("Slowest iterations and their blame", f"""SELECT fromUnixTimestamp64Nano(start_ns) AS started, job, iteration, round(slowdown, 2) AS slowdown,
  slowest_rank, slowest_gpu, blame, evidence
FROM iteration_blame FINAL
WHERE $__timeFilter(time) AND slowdown > 1.1 AND {JOB_IS}
ORDER BY slowdown DESC LIMIT 50""", kind="table", width=24, height=8),
        Panel("Slowest ranks", f"""SELECT job, rank, node, gpu, count() AS iterations, round(avg(compute_ns) / 1e6, 2) AS compute_ms,
  round(avg(comm_ns) / 1e6, 2) AS comm_ms, round(max(duration_ns) / 1e6, 2) AS worst_ms
FROM iteration_breakdown FINAL
WHERE $__timeFilter(time) AND {JOB_IS} AND {NODE_IS}
GROUP BY job, rank, node, gpu
ORDER BY compute_ms DESC LIMIT 20""", kind="table", description="Ranks that compute longest: the stragglers."),
        Panel("Iterations per second", f"""SELECT $__timeInterval(time) AS t, job, count() / $__interval_s AS iterations_per_s
FROM iteration_blame FINAL
WHERE $__timeFilter(time) AND {JOB_IS}
GROUP BY t, job ORDER BY t"""),
        Panel("Collective duration p50 / p99 (ms)", f"""SELECT $__timeInterval(time) AS t, op,
  quantile(0.5)(end_ns - start_ns) / 1e6 AS p50_ms, quantile(0.99)(end_ns - start_ns) / 1e6 AS p99_ms
FROM collectives
WHERE $__timeFilter(time) AND source = 'hook' AND {JOB_IS} AND {NODE_IS}
GROUP BY t, op ORDER BY t""", unit="ms", description="From the communication hook (flight-recorder rows repeat it)."),
        Panel("Collective traffic per job (bytes/s)", f"""SELECT $__timeInterval(time) AS t, job, sum(bytes) / $__interval_s AS bytes_per_s
FROM collectives
WHERE $__timeFilter(time) AND source = 'hook' AND {JOB_IS} AND {NODE_IS}
GROUP BY t, job ORDER BY t""", unit="Bps", description="What the ranks' collectives moved, from the communication hook."),
        Panel("Collective algorithm bandwidth (bytes/s)", f"""SELECT $__timeInterval(time) AS t, op,
  sum(bytes) / (sum(end_ns - start_ns) / 1e9) AS algbw
FROM collectives
WHERE $__timeFilter(time) AND source = 'hook' AND end_ns > start_ns AND {JOB_IS} AND {NODE_IS}
GROUP BY t, op ORDER BY t""", unit="Bps", description="Bytes each collective moved over the time it took."),
    ),
)
