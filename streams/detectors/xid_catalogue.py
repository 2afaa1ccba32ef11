"""What an XID means and what to do about it, from NVIDIA's XID catalogue (docs.nvidia.com/deploy/xid-errors).

An XID is the driver's report of an error. Some are the application's own fault (an illegal address, a kernel
that stopped): they say nothing about the hardware and open no hardware incident. The others name a class of
hardware fault; one open incident per GPU and class collects its repeats (gpu_fault.py), so XID 48 followed by 63
is one memory fault with two XIDs, not two incidents. An XID missing here is kept as "unknown": a warning that
names the code, so a new driver's XID is still seen.

`action` is what the catalogue recommends, in the words an operator acts on:
- "replace": the GPU is gone or cannot be trusted until serviced; drain the node and bring in a spare (the only
  action the pipeline itself orders, through the fleet's allocator);
- "reset_gpu": drain the GPU's jobs and reset the GPU (a row remap or a contained error is finished by a reset);
- "check_link": inspect the NVLink or its bridge, then reset;
- "watch": nothing now; a repeat escalates;
- "none": restart or debug the application.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from clocktower.schemas.analytics import IncidentKind

FaultClass = Literal["memory", "nvlink", "bus", "gsp", "engine", "application", "unknown"]
Action = Literal["replace", "reset_gpu", "check_link", "watch", "none"]
Severity = Literal["info", "warning", "critical"]


@dataclass(frozen=True)
class XidMeaning:
    xid: int
    meaning: str
    fault: FaultClass
    severity: Severity
    action: Action

    @property
    def hardware(self) -> bool:
        """Whether it opens an incident: application XIDs do not."""
        return self.fault != "application"

    @property
    def kind(self) -> IncidentKind:
        """The incident kind it opens: memory faults are `gpu_ecc`, a GPU found lost without an XID `gpu_lost`,
        every other hardware XID `gpu_xid`."""
        if self.fault == "memory":
            return "gpu_ecc"
        return "gpu_lost" if self is GPU_LOST else "gpu_xid"


def _m(xid: int, meaning: str, fault: FaultClass, severity: Severity, action: Action) -> XidMeaning:
    return XidMeaning(xid, meaning, fault, severity, action)


CATALOGUE: dict[int, XidMeaning] = {m.xid: m for m in (
    _m(13, "graphics engine exception (usually the application: an illegal instruction or address)",
       "application", "info", "none"),
    _m(31, "GPU memory page fault (the application accessed an illegal address)", "application", "info", "none"),
    _m(43, "GPU stopped processing (the application's channel was reset)", "application", "info", "none"),
    _m(45, "preemptive cleanup after an earlier error (the application ended)", "application", "info", "none"),
    _m(48, "double-bit ECC error (uncorrectable memory error)", "memory", "critical", "reset_gpu"),
    _m(61, "internal micro-controller breakpoint or warning", "engine", "warning", "reset_gpu"),
    _m(62, "internal micro-controller halt", "engine", "critical", "reset_gpu"),
    _m(63, "ECC page retirement or row remapping recorded (reset the GPU to apply it)", "memory", "warning",
       "reset_gpu"),
    _m(64, "ECC page retirement or row remapping failed", "memory", "critical", "replace"),
    _m(74, "NVLink error", "nvlink", "critical", "check_link"),
    _m(79, "GPU has fallen off the bus", "bus", "critical", "replace"),
    _m(92, "high single-bit ECC error rate", "memory", "warning", "watch"),
    _m(94, "contained memory error (the affected application was stopped; the GPU is usable)", "memory",
       "warning", "reset_gpu"),
    _m(95, "uncontained memory error (every application on the GPU is affected)", "memory", "critical",
       "reset_gpu"),
    _m(119, "GSP RPC timeout (the GPU System Processor stopped answering)", "gsp", "critical", "reset_gpu"),
    _m(120, "GSP error", "gsp", "critical", "reset_gpu"),
)}

ECC_RISE = XidMeaning(0, "uncorrectable ECC count rose", "memory", "critical", "reset_gpu")
GPU_LOST = XidMeaning(0, "the GPU no longer answers NVML (lost)", "bus", "critical", "replace")


def meaning_of(xid: int) -> XidMeaning:
    """The catalogue's entry, or an "unknown" warning that names the code."""
    return CATALOGUE.get(xid) or XidMeaning(xid, f"XID {xid} (not in the catalogue)", "unknown", "warning", "watch")
