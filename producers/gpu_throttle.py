"""NVML clock-event ("throttle") reason bits and their names, shared by the NVML source and the simulator.

The bits are NVML's `nvmlClocksEventReason*` (formerly `nvmlClocksThrottleReason*`) constants.
"""

from __future__ import annotations

THROTTLE_BITS: dict[int, str] = {
    0x001: "idle",
    0x002: "app_clocks",
    0x004: "sw_power_cap",
    0x008: "hw_slowdown",
    0x010: "sync_boost",
    0x020: "sw_thermal",
    0x040: "hw_thermal",
    0x080: "hw_power_brake",
    0x100: "display_clocks",
}


def decode_throttle(mask: int) -> list[str]:
    """The names of the reason bits set in `mask`, lowest bit first; unknown bits as `bit_N`."""
    out = []
    bit = 0
    while mask >> bit:
        if mask >> bit & 1:
            out.append(THROTTLE_BITS.get(1 << bit, f"bit_{bit}"))
        bit += 1
    return out
