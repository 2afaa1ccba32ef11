"""Collectives from PyTorch's flight recorder, turned into CollectiveEvent fields.

The flight recorder is a per-process ring buffer of every collective and p2p op issued through
torch.distributed, enabled by `TORCH_FR_BUFFER_SIZE=<entries>` (or the older
`TORCH_NCCL_TRACE_BUFFER_SIZE`) set BEFORE the process group is created. It is read with
`torch._C._distributed_c10d._dump_fr_trace_json()`. The parsing here is plain Python over the decoded
JSON, so it is testable without torch.

Mapping of one entry (one op on one rank) to a CollectiveEvent:

- seq: `collective_seq_id` (per process group, 1, 2, ...; the same collective has the same id on
  every rank of the group, so it joins across ranks). p2p entries (`is_p2p`) use `p2p_seq_id` instead
  and go to communicator "fr:<pg>:p2p" so the two counters never collide. `record_id` (the process-wide
  ring-buffer index) is not used: it differs between ranks when they use different groups.
- source: "flight_recorder". The comm hook reports the same all-reduces (source "hook"): count traffic
  from one source (the stream's breakdown and the dashboards count the hook's).
- communicator: "fr:" + the process group's name ("default" for the world group), so these events
  never collide with the comm hook's (communicator "default" or the group name).
- op: `profiling_name` ("gloo:all_reduce", "nccl:_allgather_base", ...) after the backend prefix,
  lower-cased without underscores, mapped by prefix: allreduce*, allgather*, reducescatter*,
  broadcast*, alltoall*, send*, recv*, barrier / monitoredbarrier. Anything else (reduce, gather,
  scatter, NCCL "coalesced" group markers) has no value in the schema's Literal and is SKIPPED,
  counted per name in `skipped_ops`: mapping e.g. `reduce` to allreduce would misstate the traffic.
- bytes: sum over `input_sizes` of the product of the dims times the element size of the matching
  `input_dtypes` entry (a barrier has no inputs: 0 bytes). Unknown dtypes count 0 bytes and are
  counted in `unknown_dtypes`.
- start_ns: `time_discovered_started_ns` when non-zero (NCCL with timing), else `time_created_ns`
  (when the op was enqueued on the host; system clock, ns since the epoch).
- end_ns: `time_discovered_completed_ns` when non-zero, else start + `duration_ms` when present
  (NCCL with TORCH_NCCL_ENABLE_TIMING), else start_ns. Under gloo both discovered times are 0 and
  there is no duration, so end_ns == start_ns: an FR event marks when, not how long.

An entry is emitted once it is finished (`retired`, or `state` "completed"); gloo entries stay in
state "scheduled" but are retired once done. Unfinished entries wait for a later dump, except with
`include_pending=True` (Telemetry.close), which emits them as they are. Per (group, p2p) a high-water
mark of the emitted seq makes repeated dumps emit each entry once (entries sharing one seq, as NCCL
coalesced groups may, are emitted once); collective seq ids absent from the dump (the ring buffer
wrapped before it was read) are counted in `missed`.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

ENV_VARS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")

_OP_PREFIXES = (
    ("allreduce", "allreduce"),
    ("allgather", "allgather"),
    ("reducescatter", "reducescatter"),
    ("broadcast", "broadcast"),
    ("alltoall", "alltoall"),
    ("send", "send"),
    ("recv", "recv"),
    ("barrier", "barrier"),
    ("monitoredbarrier", "barrier"),
)

# c10 ScalarType names, as the flight recorder writes them, and their sizes in bytes
DTYPE_BYTES = {
    "Byte": 1, "Char": 1, "Bool": 1, "QInt8": 1, "QUInt8": 1, "QUInt4x2": 1, "QUInt2x4": 1,
    "Float8_e5m2": 1, "Float8_e4m3fn": 1, "Float8_e5m2fnuz": 1, "Float8_e4m3fnuz": 1, "Float8_e8m0fnu": 1,
    "Short": 2, "Half": 2, "BFloat16": 2, "UInt16": 2, "Int16": 2,
    "Int": 4, "Float": 4, "QInt32": 4, "ComplexHalf": 4, "UInt32": 4,
    "Long": 8, "Double": 8, "ComplexFloat": 8, "UInt64": 8,
    "ComplexDouble": 16,
}


def buffer_size_from_env(env: dict[str, str] | None = None) -> int:
    """The configured flight-recorder capacity (entries); 0 means disabled."""
    env = os.environ if env is None else env
    for name in ENV_VARS:
        try:
            n = int(env.get(name, "0") or 0)
        except ValueError:
            continue
        if n > 0:
            return n
    return 0


def map_op(profiling_name: str) -> str | None:
    """The schema's op for a flight-recorder `profiling_name`, or None when it has none."""
    name = profiling_name.rsplit(":", 1)[-1].lower().replace("_", "")
    for prefix, op in _OP_PREFIXES:
        if name.startswith(prefix):
            return op
    return None


def entry_bytes(entry: dict[str, Any], unknown: Counter[str] | None = None) -> int:
    total = 0
    for shape, dtype in zip(entry.get("input_sizes") or [], entry.get("input_dtypes") or [], strict=False):
        size = DTYPE_BYTES.get(dtype)
        if size is None:
            if unknown is not None:
                unknown[dtype] += 1
            continue
        total += math.prod(shape) * size
    return total


def _finished(entry: dict[str, Any]) -> bool:
    return bool(entry.get("retired")) or entry.get("state") == "completed"


def entry_times(entry: dict[str, Any]) -> tuple[int, int]:
    start = int(entry.get("time_discovered_started_ns") or 0) or int(entry.get("time_created_ns") or 0)
    end = int(entry.get("time_discovered_completed_ns") or 0)
    if not end and entry.get("duration_ms") is not None:
        end = start + int(float(entry["duration_ms"]) * 1_000_000)
    return start, max(start, end)


@dataclass
class FlightRecorderDump:
    """What one dump_flight_recorder() call found and emitted."""

    status: str                                   # "enabled", "disabled: ...", "unavailable: ..."
    entries: int = 0                              # entries in the dump
    emitted: int = 0                              # new CollectiveEvents emitted
    pending: int = 0                              # unfinished entries left for a later dump
    skipped_ops: Counter[str] = field(default_factory=Counter)    # profiling_name -> entries skipped
    unknown_dtypes: Counter[str] = field(default_factory=Counter)
    missed: int = 0                               # seq ids lost to ring-buffer wrap-around
    raw: dict[str, Any] | None = None             # the decoded dump itself


class FlightRecorderReader:
    """Turns successive dumps into CollectiveEvent field dicts, each entry once."""

    def __init__(self, world_group_name: str = "0") -> None:
        self.world_group_name = world_group_name
        self.watermarks: dict[tuple[str, bool], int] = {}    # (pg name, is_p2p) -> highest seq emitted
        self.skipped_ops: Counter[str] = Counter()           # totals over all dumps
        self.missed = 0

    def communicator(self, pg_name: str, is_p2p: bool) -> str:
        label = "default" if pg_name in (self.world_group_name, "") else pg_name
        return f"fr:{label}:p2p" if is_p2p else f"fr:{label}"

    def read(self, dump: dict[str, Any], include_pending: bool = False
             ) -> tuple[list[dict[str, Any]], FlightRecorderDump]:
        """(fields of the new events: source, communicator, op, seq, bytes, start_ns, end_ns; the summary)."""
        entries = dump.get("entries") or []
        summary = FlightRecorderDump(status="enabled", entries=len(entries), raw=dump)
        by_key: dict[tuple[str, bool], list[tuple[int, dict[str, Any]]]] = {}
        for e in entries:
            pg = e.get("process_group") or [str(e.get("pg_id", ""))]
            is_p2p = bool(e.get("is_p2p"))
            seq = int(e.get("p2p_seq_id" if is_p2p else "collective_seq_id") or 0)
            by_key.setdefault((str(pg[0]), is_p2p), []).append((seq, e))
        out: list[dict[str, Any]] = []
        for key, items in by_key.items():
            items.sort(key=lambda x: x[0])
            mark = self.watermarks.get(key, 0)
            for seq, e in items:
                if seq <= mark:
                    continue
                if not include_pending and not _finished(e):
                    summary.pending += sum(1 for s, _ in items if s >= seq)
                    break
                if not key[1] and seq > mark + 1:
                    summary.missed += seq - mark - 1
                mark = seq
                op = map_op(str(e.get("profiling_name", "")))
                if op is None:
                    summary.skipped_ops[str(e.get("profiling_name", ""))] += 1
                    continue
                start_ns, end_ns = entry_times(e)
                out.append({"source": "flight_recorder", "communicator": self.communicator(*key), "op": op, "seq": seq,
                            "bytes": entry_bytes(e, summary.unknown_dtypes), "start_ns": start_ns,
                            "end_ns": end_ns})
            self.watermarks[key] = mark
        summary.emitted = len(out)
        self.skipped_ops.update(summary.skipped_ops)
        self.missed += summary.missed
        return out, summary


def dump_json(torch: Any) -> dict[str, Any]:
    """The current process's flight recorder, decoded (collectives only, no stack traces)."""
    raw = torch._C._distributed_c10d._dump_fr_trace_json(includeCollectives=True)
    return json.loads(raw)
