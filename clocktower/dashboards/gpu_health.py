"""GPU health: everything NVML reports per GPU, and the faults that take one out of training."""

from __future__ import annotations

from clocktower.dashboards.counters import increase_per_interval
from clocktower.dashboards.layout import Dashboard, Panel
from clocktower.dashboards.variables import GPU_IS, NODE_IS

GPU = "concat(node, '/gpu', toString(gpu))"
WHERE = f"$__timeFilter(time) AND {NODE_IS} AND {GPU_IS}"


def _per_gpu(title: str, value: str, unit: str, description: str = "") -> Panel:
    return Panel(title, f"""SELECT $__timeInterval(time) AS t, {GPU} AS gpu_id, {value}
FROM gpu_health
WHERE {WHERE} AND NOT lost
GROUP BY t, gpu_id ORDER BY t""", unit=unit, width=8, description=description)


DASHBOARD = Dashboard(
    uid="clocktower-gpu", title="clocktower: GPU health",
    question="Is every GPU healthy: load, heat, power, clocks, throttling, XIDs, ECC, retired rows, NVLink, PCIe?",
    variables=("cluster", "node", "gpu"),
    panels=(
        _per_gpu("GPU utilization (%)", "max(gpu_util_pct) AS util_pct", "percent"),
        _per_gpu("Memory utilization (%)", "max(mem_util_pct) AS mem_util_pct", "percent"),
        _per_gpu("Memory used", "max(mem_used_bytes) AS used", "bytes"),
        _per_gpu("Temperature (°C)", "max(temperature_c) AS temp_c", "celsius"),
        _per_gpu("Power (W)", "max(power_w) AS power", "watt"),
        _per_gpu("SM clock (MHz)", "min(sm_clock_mhz) AS sm_mhz", "none",
                 "The lowest SM clock in the interval: a throttled GPU drops here first."),
        Panel("Throttling", f"""SELECT time, node, gpu, throttle AS reasons, hex(throttle_reasons) AS mask, temperature_c, sm_clock_mhz
FROM gpu_health
WHERE {WHERE} AND length(throttle) > 0
ORDER BY time DESC LIMIT 1 BY node, gpu, reasons
LIMIT 100""", kind="table", width=12,
              description="Each throttle-reason set a GPU showed, latest first (NVML's clocks-event reasons)."),
        Panel("XID errors", f"""SELECT min(time) AS first_seen, node, gpu, xid, count() AS samples
FROM gpu_health
WHERE {WHERE} AND xid > 0
GROUP BY node, gpu, xid ORDER BY first_seen DESC LIMIT 100""", kind="table", width=12),
        Panel("ECC errors per interval", increase_per_interval(
            "gpu_health", GPU, {"corrected": "ecc_corrected", "uncorrected": "ecc_uncorrected"},
            f"{NODE_IS} AND {GPU_IS}"), width=8),
        Panel("NVLink errors and PCIe replays per interval", increase_per_interval(
            "gpu_health", GPU, {"nvlink_errors": "arraySum(nvlink_errors)", "pcie_replays": "pcie_replay"},
            f"{NODE_IS} AND {GPU_IS}"), width=8),
        Panel("Retired pages and remapped rows", f"""SELECT node, gpu, argMax(uuid, ts_ns) AS uuid, argMax(retired_pages, ts_ns) AS retired_pages,
  argMax(remapped_rows_correctable, ts_ns) AS remapped_correctable,
  argMax(remapped_rows_uncorrectable, ts_ns) AS remapped_uncorrectable,
  argMax(remap_pending, ts_ns) AS remap_pending, argMax(remap_failed, ts_ns) AS remap_failed
FROM gpu_health
WHERE {WHERE}
GROUP BY node, gpu
ORDER BY remapped_uncorrectable DESC, retired_pages DESC, node, gpu LIMIT 200""", kind="table", width=8,
              description="Each GPU's latest counts: a pending or failed remap needs a reset or a swap."),
        Panel("Throttled share per GPU (per-minute rollup)", f"""SELECT minute AS t, {GPU} AS gpu_id, sum(throttled_samples) / sum(samples) AS throttled
FROM gpu_health_1m
WHERE $__timeFilter(minute) AND {NODE_IS} AND {GPU_IS}
GROUP BY t, gpu_id
HAVING throttled > 0
ORDER BY t""", unit="percentunit", width=24,
              description="From the gpu_health_1m rollup: which GPUs throttle, and how much of each minute."),
        Panel("GPUs off the bus", f"""SELECT min(time) AS first_lost, node, gpu, argMax(uuid, ts_ns) AS uuid, count() AS samples_lost
FROM gpu_health
WHERE {WHERE} AND lost
GROUP BY node, gpu ORDER BY first_lost DESC""", kind="table", width=24, height=6),
    ),
)
