"""GPU vocabulary shared by the NVML agent and the DCGM parser: throttle-reason bits and Xid names.

The bit values are NVML's ``nvmlClocksEventReason*`` (formerly ``nvmlClocksThrottleReason*``)
constants, which DCGM's ``DCGM_FI_DEV_CLOCK_THROTTLE_REASONS`` / ``…_CLOCKS_EVENT_REASONS`` fields
report unchanged. Names are snake_case, as the node agent and the simulator's ``/sim/gpu`` send them.
"""

from __future__ import annotations

__all__ = ["THROTTLE_REASON_BITS", "XID_NAMES", "throttle_names", "xid_name"]

THROTTLE_REASON_BITS: dict[str, int] = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}

# A few Xids operators meet most (NVIDIA's Xid catalogue); others are shown by number.
XID_NAMES: dict[int, str] = {
    13: "graphics engine exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "preemptive cleanup",
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping event",
    64: "ECC page retirement or row remapping failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}


def throttle_names(mask: int) -> list[str]:
    """Names of the reasons set in an NVML clocks-event bitmask (unknown bits as ``bit_0x…``)."""
    out = [name for name, bit in THROTTLE_REASON_BITS.items() if mask & bit]
    known = 0
    for bit in THROTTLE_REASON_BITS.values():
        known |= bit
    extra = mask & ~known
    bit = 1
    while extra:
        if extra & bit:
            out.append(f"bit_{bit:#x}")
            extra &= ~bit
        bit <<= 1
    return out


def xid_name(xid: int) -> str:
    return f"Xid {xid} ({XID_NAMES[xid]})" if xid in XID_NAMES else f"Xid {xid}"
