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


_FLOW = dict(src_ip="198.18.0.1", dst_ip="198.18.1.1", src_port=40000, dst_port=4791)
_IB = dict(ib_state="ACTIVE", port_xmit_data=4096, port_rcv_data=8192, port_xmit_packets=2, port_rcv_packets=3,
           port_rcv_errors=0, port_xmit_discards=0, symbol_error=0, link_downed=1, link_error_recovery=0)

# One complete, valid event per schema (JSON values), plus the variants that `REQUIRED_WHEN` tells apart.
SAMPLES: dict[str, dict[str, Any]] = {
    "flow_sample": dict(node="node-0", ts_ns=T0, interface="eth0", direction="tx", **_FLOW, proto="roce", seq=1,
                        bytes=4096, packets=1, retransmits=0, priority=3),
    "clock_probe": dict(node="node-1", ts_ns=T0, pair_id=7, idx=0, sender="node-0", receiver="node-1", tx_ns=T0 - 5,
                        rx_ns=T0),
    "collective": dict(node="node-0", ts_ns=T0, job="j", rank=0, communicator="world", op="allreduce", seq=1,
                       bytes=2**20, start_ns=T0 - 1000, end_ns=T0, source="hook"),
    "iteration": dict(node="node-0", ts_ns=T0, job="j", rank=0, iteration=3, start_ns=T0 - 10**9, end_ns=T0,
                      collectives=4),
    "gpu_health": dict(node="node-0", ts_ns=T0, gpu=0, uuid="GPU-0", **GPU_READINGS),
    "gpu_health/lost": dict(node="node-0", ts_ns=T0, gpu=0, uuid="GPU-0",   # lost: every reading null
                            **{**{k: [] if isinstance(v, list) else None for k, v in GPU_READINGS.items()},
                               "lost": True, "xid": 79}),
    "link_state": dict(node="node-0", ts_ns=T0, interface="eth0", **ETHERNET),
    "link_state/infiniband": dict(node="node-0", ts_ns=T0, interface="mlx5_0/1", kind="infiniband", up=True,
                                  carrier_changes=1, speed_mbps=400_000, operstate="LinkUp", carrier=True, **_IB),
    "flow_counters": dict(node="node-0", ts_ns=T0, source="sock", direction="tx", **_FLOW, proto="tcp", priority=0,
                          bytes=4096, retransmits=1, interval_ns=10**9),
    "flow_counters/tc": dict(node="node-0", ts_ns=T0, source="tc", interface="eth0", direction="rx", **_FLOW,
                             proto="tcp", priority=3, bytes=4096, packets=3, interval_ns=10**9),
    "connection_state": dict(node="node-0", ts_ns=T0, **_FLOW, proto="tcp", old_state="SYN_SENT",
                             new_state="ESTABLISHED"),
    "flow_latency": dict(node="node-1", ts_ns=T0, src_node="node-0", **_FLOW, proto="roce", seq=1, bytes=4096,
                         tx_ns=T0 - 5000, rx_ns=T0, latency_ns=5000, clock_corrected=True,
                         corrected_latency_ns=4800, error_bound_ns=100),
    "clock_estimate": dict(node="node-1", ts_ns=T0, reference="node-0", offset_ns=-200, drift_ppb=1.5,
                           error_bound_ns=100),
    "clock_edge_fit": dict(node="node-0", ts_ns=T0, hi="node-1", delay_ns=3000.5, offset_ns=-200.25, drift_ppb=1.5,
                           curvature_ns_per_s2=0.1, cov=[1.0, 0, 0, 0, 0, 1.0, 0, 0, 0, 0, 1.0, 0, 0, 0, 0, 1.0],
                           sigma_ns=5.0, n_fwd=100, n_rev=90, t_first_s=-2.0, t_last_fwd_s=-0.01, t_last_rev_s=None,
                           valid=True),
    "iteration_breakdown": dict(node="node-0", ts_ns=T0, job="j", rank=0, iteration=3, start_ns=T0 - 10**9,
                                end_ns=T0, duration_ns=10**9, comm_ns=2 * 10**8, compute_ns=8 * 10**8, collectives=4,
                                comm_bytes=2**22),
    "iteration_blame": dict(node="node-0", ts_ns=T0, job="j", iteration=3, start_ns=T0 - 10**9, duration_ns=10**9,
                            baseline_ns=7 * 10**8, slowdown=1.43, ranks=16, slowest_rank=5, slowest_gpu=5,
                            slowest_compute_ns=8 * 10**8, median_compute_ns=5 * 10**8, median_comm_ns=2 * 10**8,
                            blame="gpu", evidence='{"incident":"inc-1"}'),
    "heartbeat": dict(node="node-0", ts_ns=T0, seq=7, interval_ms=200),
    "incident": dict(node="node-0", ts_ns=T0, incident_id="inc-1", kind="gpu_thermal", state="open",
                     severity="warning", target="node-0/gpu0", opened_ns=T0, detail="95 C"),
    "control_command": dict(node="node-0", ts_ns=T0, command_id="c-1", action="drain", target="node-0",
                            params={"reason": "gpu_lost"}, incident_id="inc-1", expires_ns=T0 + 10**9,
                            signature="00ff"),
    "control_ack": dict(node="node-0", ts_ns=T0, command_id="c-1", status="applied", detail=""),
    "replacement_request": dict(node="node-0", ts_ns=T0, incident_id="i-1", reason="gpu_lost", gpu=3),
    "injected_fault": dict(node="node-0", ts_ns=T0, fault_id="f-1", kind="link_flap", target="eth0", start_ns=T0,
                           end_ns=T0 + 10**9, detail=""),
    "deadletter": dict(node="node-0", ts_ns=T0, origin_topic="telemetry.gpu", origin_partition=0, origin_offset=7,
                       reason="invalid missing at 0.power_w: Field required", detector="sink", raw_b64="W10="),
    "streams_tick": dict(node="clocktower-streams-host-a", ts_ns=T0),
}
