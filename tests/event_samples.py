"""Complete, valid events for tests: every required field set, so a fixture never leans on a fake default."""

from __future__ import annotations

from typing import Any

from clocktower.schemas.telemetry import GpuHealth, LinkState

T0 = 1_700_000_000_000_000_000

GPU_READINGS: dict[str, Any] = dict(
    lost=False, temperature_c=60.0, power_w=550.0, sm_clock_mhz=1980, mem_clock_mhz=2619, gpu_util_pct=95,
    mem_util_pct=50, mem_used_bytes=60 * 2**30, throttle_reasons=0, ecc_corrected=0, ecc_uncorrected=0, xid=0,
    pcie_replay=0, nvlink_errors=[], throttle=[], retired_pages=0, remapped_rows_correctable=0,
    remapped_rows_uncorrectable=0, remap_pending=False, remap_failed=False)

ETHERNET: dict[str, Any] = dict(kind="ethernet", up=True, carrier_changes=0, speed_mbps=400_000, operstate="up",
                                carrier=True)


def gpu_health(node: str = "node-0", ts_ns: int = T0, gpu: int = 0, uuid: str | None = None,
               **kw: Any) -> GpuHealth:
    """A healthy GPU's full reading; keywords override any field."""
    return GpuHealth(**{"node": node, "ts_ns": ts_ns, "gpu": gpu, "uuid": uuid or f"GPU-{gpu}", **GPU_READINGS,
                        **kw})


def link_state(node: str = "node-0", ts_ns: int = T0, interface: str = "eth0", up: bool = True,
               **kw: Any) -> LinkState:
    """An Ethernet port's full state, up or down; keywords override any field."""
    base = ETHERNET if up else {**ETHERNET, "up": False, "speed_mbps": 0, "operstate": "down", "carrier": False}
    return LinkState(node=node, ts_ns=ts_ns, interface=interface, **{**base, **kw})
