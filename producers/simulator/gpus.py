"""NVML-style GPU health readings of every GPU, with the GPU faults acted out.

Each GPU reads at `gpu_health_hz` with a fixed random phase. A healthy H100/H200-like
GPU runs at 60-70 C and 500-650 W, SM clock ~1980 MHz, memory clock 2619 MHz,
~95 % utilisation while its rank computes (less while it waits on the
all-reduce), ~60 GiB used, no throttling, no errors, 18 NVLink error counters
at zero. Faults: thermal (90-95 C, throttle bits 0x60, SM ~1200 MHz), XID 79
(one reading with xid=79, then every reading lost=True with everything else
zero), another XID (one reading with it), ECC (ecc_uncorrected +1 and its XID on that one reading).

A thermal fault climbs first: from its start the temperature rises linearly to the slowdown threshold
(SLOWDOWN_C) over the window's `ramp_ns`, unthrottled; past it the GPU reads 90-95 C, throttled.

Background noise (SimConfig.background_noise), which no detector may call a fault: each GPU's temperature swings
by up to +-3 C over a period of 30-90 s; a GPU enters a software power-cap episode (throttle bit 0x04, SM clock
1600-1700 MHz, power held at 450-480 W) for 1-4 s about once every 5 minutes; correctable ECC errors count up.
"""

from __future__ import annotations

import math
import random

from clocktower.producers.event_builder import EventBuilder
from clocktower.producers.gpu_throttle import decode_throttle
from clocktower.producers.simulator.config import SimConfig
from clocktower.producers.simulator.fault_schedule import (
    SLOWDOWN_C,
    THERMAL_THROTTLE,
    XID_GPU_LOST,
    FaultSchedule,
)
from clocktower.producers.simulator.flows import Planned
from clocktower.producers.simulator.node_clock import NodeClock
from clocktower.producers.simulator.topology import Topology
from clocktower.producers.simulator.training import TrainingJob
from clocktower.schemas.telemetry import GpuHealth

GIB = 2**30
SM_CLOCK_MHZ = 1980
THROTTLED_SM_CLOCK_MHZ = 1200
MEM_CLOCK_MHZ = 2619
NVLINKS = 18
POWER_CAP = 0x04                  # NVML SW power cap
CAP_CHANCE = 1 / 3000             # per reading: about once every 5 minutes at 10 Hz


class _Gpu:
    __slots__ = ("node", "gpu", "rank", "uuid", "phase", "base_temp", "temp", "power", "mem_used",
                 "ecc_corrected", "xid_at", "ecc_at", "xid_sent", "ecc_sent", "xid", "ecc_xid", "ecc_before",
                 "swing_period_s", "swing_phase", "cap_until")

    def __init__(self, node: int, gpu: int, rank: int, uuid: str, phase: int, rng: random.Random) -> None:
        self.node, self.gpu, self.rank, self.uuid, self.phase = node, gpu, rank, uuid, phase
        self.base_temp = rng.uniform(60.0, 66.0)
        self.temp = self.base_temp
        self.power = rng.uniform(520.0, 600.0)
        self.mem_used = int(rng.uniform(58.0, 62.0) * GIB)
        self.ecc_corrected = 0
        self.xid_at = -1
        self.ecc_at = -1
        self.xid_sent = False
        self.ecc_sent = False
        self.xid = XID_GPU_LOST
        self.ecc_xid = 0
        self.ecc_before = 0
        self.swing_period_s = rng.uniform(30.0, 90.0)
        self.swing_phase = rng.uniform(0.0, 2 * math.pi)
        self.cap_until = -1


class GpuMonitor:
    """Plans the health readings of all GPUs, one reading period at a time."""

    def __init__(self, config: SimConfig, topo: Topology, clocks: list[NodeClock], faults: FaultSchedule,
                 training: TrainingJob, start_ns: int, rng: random.Random) -> None:
        self.topo = topo
        self.clocks = clocks
        self.faults = faults
        self.training = training
        self.rng = rng
        self.period = round(1e9 / config.gpu_health_hz)
        self.noise = config.background_noise
        self.start_ns = start_ns
        self.slot = 0
        self._build = EventBuilder(GpuHealth)
        self.gpus: list[_Gpu] = []
        for n in range(topo.nodes):
            for g in range(topo.gpus_per_node):
                phase = 1 + int(rng.random() * (self.period - 1))
                gpu = _Gpu(n, g, topo.rank(n, g), topo.gpu_uuid(n, g), phase, rng)
                xid, ecc = faults.xid_window(n, g), faults.ecc_window(n, g)
                gpu.xid_at = xid.start_ns if xid else -1
                gpu.ecc_at = ecc.start_ns if ecc else -1
                gpu.xid = xid.xid if xid else XID_GPU_LOST
                gpu.ecc_xid = ecc.xid if ecc else 0
                self.gpus.append(gpu)

    @property
    def next_slot_ns(self) -> int:
        return self.start_ns + self.slot * self.period

    def plan(self, until: int, out: Planned) -> None:
        """Plan every reading period that begins at or before true time `until`."""
        while self.next_slot_ns <= until:
            base = self.next_slot_ns
            for gpu in self.gpus:
                t = base + gpu.phase
                out.append((t, self._reading(gpu, t)))
            self.slot += 1

    def _reading(self, gpu: _Gpu, t: int) -> GpuHealth:
        rng = self.rng
        rand = rng.random
        node = self.topo.node_ids[gpu.node]
        ts = self.clocks[gpu.node].stamp(t, rng)
        if 0 <= gpu.xid_at <= t and gpu.xid_sent and gpu.xid == XID_GPU_LOST:
            return self._build(node=node, ts_ns=ts, gpu=gpu.gpu, uuid=gpu.uuid, lost=True,
                               temperature_c=None, power_w=None, sm_clock_mhz=None, mem_clock_mhz=None,
                               gpu_util_pct=None, mem_util_pct=None, mem_used_bytes=None, throttle_reasons=None,
                               ecc_corrected=None, ecc_uncorrected=None, xid=0, pcie_replay=None, nvlink_errors=[],
                               throttle=[], retired_pages=None, remapped_rows_correctable=None,
                               remapped_rows_uncorrectable=None, remap_pending=None, remap_failed=None)
        xid = 0
        if 0 <= gpu.xid_at <= t and not gpu.xid_sent:
            gpu.xid_sent = True
            xid = gpu.xid
        ecc_uncorrected = 0
        if 0 <= gpu.ecc_at <= t:
            ecc_uncorrected = 1
            if not gpu.ecc_sent:
                gpu.ecc_sent = True
                xid = xid or gpu.ecc_xid
        if rand() < 0.002:
            gpu.ecc_corrected += 1
        computing = self.training.computing(gpu.rank, t)
        util = 93 + int(rand() * 5) if computing else 30 + int(rand() * 20)
        base = gpu.base_temp
        if self.noise:
            base += 3.0 * math.sin(gpu.swing_phase + 2 * math.pi * (t - self.start_ns) / 1e9 / gpu.swing_period_s)
        gpu.temp += 0.1 * (base + (3.5 if computing else 0.0) - gpu.temp) + rng.gauss(0.0, 0.15)
        temp = gpu.temp
        power = gpu.power + (rand() * 40.0 if computing else -rand() * 20.0)
        sm_clock = SM_CLOCK_MHZ - int(rand() * 15)
        throttle = 0
        if self.noise and gpu.cap_until < t and rand() < CAP_CHANCE:
            gpu.cap_until = t + int(rng.uniform(1.0, 4.0) * 1e9)
        if t <= gpu.cap_until:
            throttle = POWER_CAP
            sm_clock = 1600 + int(rand() * 100)
            power = 450.0 + rand() * 30.0
        window = self.faults.thermal_window(gpu.node, gpu.gpu, t)
        if window is not None:
            climbed = (t - window.start_ns) / window.ramp_ns if window.ramp_ns else 1.0
            if climbed < 1.0:
                temp = temp + (SLOWDOWN_C - 1.0 - temp) * climbed   # climbing, not yet throttled
            else:
                temp = 90.0 + rand() * 5.0
                throttle = THERMAL_THROTTLE
                sm_clock = THROTTLED_SM_CLOCK_MHZ + int(rand() * 30) - 15
                power *= 0.75
        return self._build(node=node, ts_ns=ts, gpu=gpu.gpu, uuid=gpu.uuid, lost=False,
                           temperature_c=round(temp, 1), power_w=round(power, 1), sm_clock_mhz=sm_clock,
                           mem_clock_mhz=MEM_CLOCK_MHZ, gpu_util_pct=util, mem_util_pct=util // 2 + 5,
                           mem_used_bytes=gpu.mem_used, throttle_reasons=throttle,
                           ecc_corrected=gpu.ecc_corrected, ecc_uncorrected=ecc_uncorrected, xid=xid,
                           pcie_replay=0, nvlink_errors=[0] * NVLINKS,
                           throttle=decode_throttle(throttle), retired_pages=0, remapped_rows_correctable=0,
                           remapped_rows_uncorrectable=0, remap_pending=False, remap_failed=False)
