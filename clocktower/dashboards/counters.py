"""SQL for cumulative counters: what grew per interval, not the running total a port or GPU reports."""

from __future__ import annotations


def increase_per_interval(table: str, key: str, counters: dict[str, str], where: str) -> str:
    """One series per `key` (an expression naming the series) and alias of `counters` (alias -> counter column):
    the sum of each counter's increase between consecutive samples of the same series within the interval.
    A counter that went down (the device reset it) counts from zero; the first sample of a series in the time
    range counts 0, as nothing before it is read."""
    deltas = ",\n        ".join(
        f"toInt64(if({c} >= lagInFrame({c}, 1, {c}) OVER w, {c} - lagInFrame({c}, 1, {c}) OVER w, {c})) AS {alias}"
        for alias, c in counters.items())
    sums = ", ".join(f"sum({alias}) AS {alias}" for alias in counters)
    return f"""SELECT $__timeInterval(at) AS t, series, {sums}
FROM (SELECT time AS at, {key} AS series,
        {deltas}
      FROM {table}
      WHERE $__timeFilter(time) AND {where}
      WINDOW w AS (PARTITION BY {key} ORDER BY ts_ns ROWS BETWEEN 1 PRECEDING AND CURRENT ROW))
GROUP BY t, series ORDER BY t"""
