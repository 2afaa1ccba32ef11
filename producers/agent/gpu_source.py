"""The node agent's GPU-health source: NVML (nvidia-ml-py's `pynvml`) polled at `hz`, plus XID events.

Two threads:

- the poller reads every GPU each tick and emits one `GpuHealth` per GPU (one `emit` call per tick).
  Each field is read on its own: a field the GPU does not support (`NVMLError_NotSupported`, or a
  driver too old to have the function) is null (no reading, never a 0) and is not asked again for that GPU;
  it never fails the reading. A GPU that answers `NVMLError_GpuIsLost` is reported once as
  `GpuHealth(lost=True)`, every reading null, when it goes, retried every tick, and reported normally
  again (lost=False) if it comes back; the other GPUs keep reporting meanwhile.
- the XID watcher waits on NVML's event API (`nvmlEventTypeXidCriticalError`, with a timeout so it can
  stop) and emits, for the GPU concerned, an immediate reading with `xid` set.

Neither thread ever dies of an NVML error: unexpected ones are logged (once per kind) and counted in
`errors`; `counts` holds the events emitted, per schema, like every source.

`library_path` loads that NVML library (e.g. a test stub) instead of the system `libnvidia-ml.so.1`.
pynvml holds one library per process (`pynvml.nvmlLib`), so a source whose library differs from the one
loaded can only swap it while no one holds NVML initialised; otherwise `check()` says so.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import threading
import time
import typing
from collections import Counter
from collections.abc import Callable
from typing import Any

import pynvml

from clocktower.producers.agent.source import Availability, Emit
from clocktower.producers.gpu_throttle import decode_throttle
from clocktower.schemas.telemetry import GpuHealth

log = logging.getLogger(__name__)

SYSTEM_LIBRARY = "libnvidia-ml.so.1"
# Every GpuHealth reading, unread: null (lists empty). A field NVML gives replaces its entry.
_NO_READINGS: dict[str, Any] = {
    **{n: None for n, f in GpuHealth.model_fields.items() if type(None) in typing.get_args(f.annotation)},
    "nvlink_errors": [], "throttle": []}
XID_WAIT_MS = 200          # the XID watcher's wait; bounds how long stop() takes
# Error counters summed per NVLink link into `nvlink_errors[link]` (data-link layer, cumulative since the
# driver loaded or the counters were reset): replays, recoveries, and flit/data CRC errors.
NVLINK_COUNTERS = (pynvml.NVML_NVLINK_ERROR_DL_REPLAY, pynvml.NVML_NVLINK_ERROR_DL_RECOVERY,
                   pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT, pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA)

# "this GPU or driver has no such reading": the field keeps its default and is not asked again
_SKIP = (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound, pynvml.NVMLError_ArgumentVersionMismatch)


class _GpuLost(Exception):
    """Raised out of a reading when the GPU answered NVML_ERROR_GPU_IS_LOST."""


def _load_library(library_path: str | None) -> None:
    """Make pynvml use `library_path` (or the system library when None) for its next `nvmlInit`.

    pynvml loads its library lazily into the module global `nvmlLib` (`_LoadNvmlLibrary`) and caches
    function pointers in `_nvmlGetFunctionPointer_cache`. Loading another library means setting the first
    and clearing the second, under pynvml's own `libLoadLock`, and only while nothing holds NVML
    initialised (`_nvmlLib_refcount == 0`). Raises `pynvml.NVMLError_LibraryNotFound` when the file
    cannot be loaded and `RuntimeError` when another library is in use in this process.
    """
    wanted = library_path or SYSTEM_LIBRARY
    with pynvml.libLoadLock:
        current = pynvml.nvmlLib
        if current is not None and getattr(current, "_name", None) == wanted:
            return
        if current is not None and pynvml._nvmlLib_refcount > 0:
            raise RuntimeError(f"this process already uses the NVML library {getattr(current, '_name', '?')!r}; "
                               f"cannot switch to {wanted!r} while it is initialised")
        pynvml._nvmlGetFunctionPointer_cache.clear()
        if library_path is None:
            pynvml.nvmlLib = None          # pynvml's own loader finds the system library in nvmlInit
            return
        try:
            pynvml.nvmlLib = ctypes.CDLL(library_path)
        except OSError as exc:
            pynvml.nvmlLib = None
            log.debug("cannot load %s: %s", library_path, exc)
            raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND) from exc


def _init(library_path: str | None) -> None:
    _load_library(library_path)
    pynvml.nvmlInit()


def _unavailable_reason(exc: BaseException, library_path: str | None) -> str:
    where = f"at {library_path}" if library_path else f"({SYSTEM_LIBRARY})"
    if isinstance(exc, pynvml.NVMLError_LibraryNotFound):
        if library_path:
            return f"NVML library not found {where}"
        return f"NVML library not found {where}: no NVIDIA driver on this machine"
    if isinstance(exc, pynvml.NVMLError_DriverNotLoaded):
        return "NVIDIA driver not loaded (NVML library present, kernel module not running)"
    if isinstance(exc, pynvml.NVMLError_NoPermission):
        return "no permission to use NVML (check /dev/nvidia* access)"
    if isinstance(exc, pynvml.NVMLError_LibRmVersionMismatch):
        return "NVML library and NVIDIA kernel driver versions differ (reboot or reload the driver)"
    if isinstance(exc, pynvml.NVMLError_FunctionNotFound):
        return f"NVML library {where} lacks a required function (driver too old?)"
    if isinstance(exc, pynvml.NVMLError):
        return f"NVML failed: {exc} (NVML error {exc.value})"
    return f"NVML unusable: {type(exc).__name__}: {exc}"


class GpuSource:
    """Polls every GPU through NVML at `hz` and watches for XID errors; see the module docstring."""

    name = "gpu"

    def __init__(self, node: str, hz: float = 10.0, library_path: str | None = None) -> None:
        if hz <= 0:
            raise ValueError("hz must be positive")
        self.node = node
        self.hz = hz
        self.library_path = library_path
        self.counts: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()      # unexpected NVML errors, per "field:ErrorClass"
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._emit: Emit | None = None
        self._initialised = False
        self._handles: list[Any] = []
        self._uuids: list[str] = []
        self._lost: list[bool] = []
        self._unsupported: list[set[str]] = []
        self._event_set: Any = None
        self._xid_gpus: dict[int, int] = {}      # handle address -> GPU index

    # ---- Source protocol ----

    def check(self) -> Availability:
        try:
            _init(self.library_path)
        except Exception as exc:
            return Availability(False, _unavailable_reason(exc, self.library_path))
        try:
            n = pynvml.nvmlDeviceGetCount()
            try:
                driver = pynvml.nvmlSystemGetDriverVersion()
            except pynvml.NVMLError:
                driver = "unknown"
        except Exception as exc:
            return Availability(False, _unavailable_reason(exc, self.library_path))
        finally:
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlShutdown()
        if n == 0:
            return Availability(False, "NVML works but reports no GPUs on this machine")
        return Availability(True, f"{n} GPU(s) via NVML, driver {driver}, polled at {self.hz:g} Hz")

    def start(self, emit: Emit) -> None:
        if self._threads:
            raise RuntimeError("GpuSource already started")
        _init(self.library_path)
        self._initialised = True
        self._emit = emit
        self._stop.clear()
        try:
            n = pynvml.nvmlDeviceGetCount()
            self._handles = [None] * n
            self._uuids = [f"gpu-{i}" for i in range(n)]
            self._lost = [False] * n
            self._unsupported = [set() for _ in range(n)]
            for i in range(n):
                try:
                    self._get_handle(i)
                except (_GpuLost, pynvml.NVMLError) as exc:   # the poller retries it every tick
                    log.warning("GPU %d: no handle at start (%s); no XID events for it", i,
                                str(exc) or "GPU is lost")
            # Register for XIDs before returning, so that none raised after start() is missed.
            self._event_set, self._xid_gpus = self._register_xid_events()
        except BaseException:
            self.stop()
            raise
        self._threads = [threading.Thread(target=self._poll_loop, name="gpu-poll", daemon=True)]
        if self._event_set is not None:
            self._threads.append(threading.Thread(target=self._xid_loop, name="gpu-xid", daemon=True))
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=5.0)
        stuck = [t.name for t in self._threads if t.is_alive()]
        self._threads = []
        if stuck:   # a thread hung inside NVML: leave NVML alone rather than free what it is using
            log.warning("GPU source threads %s did not stop; NVML left initialised", stuck)
            return
        if self._event_set is not None:
            try:
                pynvml.nvmlEventSetFree(self._event_set)
            except pynvml.NVMLError as exc:
                log.debug("nvmlEventSetFree: %s", exc)
            self._event_set = None
        if self._initialised:
            self._initialised = False
            try:
                pynvml.nvmlShutdown()
            except pynvml.NVMLError as exc:
                log.warning("nvmlShutdown: %s", exc)

    # ---- handles and readings ----

    def _get_handle(self, i: int) -> Any:
        """The NVML handle of GPU `i` (cached), with its UUID; raises _GpuLost or NVMLError."""
        if self._handles[i] is None:
            try:
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
            except pynvml.NVMLError_GpuIsLost as exc:
                raise _GpuLost from exc
            try:
                self._uuids[i] = pynvml.nvmlDeviceGetUUID(h) or self._uuids[i]
            except pynvml.NVMLError_GpuIsLost as exc:
                raise _GpuLost from exc
            self._handles[i] = h
        return self._handles[i]

    def _field(self, i: int, name: str, fn: Callable[[], Any]) -> Any:
        """`fn()`, or None if the GPU does not support it (remembered) or it failed unexpectedly (counted)."""
        if name in self._unsupported[i]:
            return None
        try:
            return fn()
        except pynvml.NVMLError_GpuIsLost as exc:
            raise _GpuLost from exc
        except _SKIP:
            self._unsupported[i].add(name)
            log.info("GPU %d: %s not supported, left at its default", i, name)
            return None
        except pynvml.NVMLError as exc:
            self._count_error(f"{name}:{type(exc).__name__}", exc, i)
            return None

    def _count_error(self, key: str, exc: BaseException, gpu: int | None = None) -> None:
        with self._lock:
            self.errors[key] += 1
            first = self.errors[key] == 1
        if first:
            log.warning("GPU %s: %s: %s (counted in errors[%r]; further ones not logged)", gpu, key, exc, key)

    def _read(self, i: int) -> dict[str, Any]:
        """Every field of GPU `i` that it supports, as GpuHealth keyword arguments. Raises _GpuLost."""
        h = self._get_handle(i)
        f: dict[str, Any] = {**_NO_READINGS, "gpu": i, "uuid": self._uuids[i], "lost": False}
        nv = pynvml

        temp = self._field(i, "temperature", lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))
        if temp is not None:
            f["temperature_c"] = float(temp)
        mw = self._field(i, "power", lambda: nv.nvmlDeviceGetPowerUsage(h))
        if mw is not None:
            f["power_w"] = mw / 1000.0
        sm = self._field(i, "sm_clock", lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM))
        if sm is not None:
            f["sm_clock_mhz"] = sm
        mem = self._field(i, "mem_clock", lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM))
        if mem is not None:
            f["mem_clock_mhz"] = mem
        util = self._field(i, "utilization", lambda: nv.nvmlDeviceGetUtilizationRates(h))
        if util is not None:
            f["gpu_util_pct"] = min(int(util.gpu), 100)
            f["mem_util_pct"] = min(int(util.memory), 100)
        used = self._field(i, "memory_v2", lambda: nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2).used)
        if used is None:
            used = self._field(i, "memory", lambda: nv.nvmlDeviceGetMemoryInfo(h).used)
        if used is not None:
            f["mem_used_bytes"] = used
        mask = self._field(i, "clocks_event_reasons", lambda: nv.nvmlDeviceGetCurrentClocksEventReasons(h))
        if mask is None:
            mask = self._field(i, "clocks_throttle_reasons", lambda: nv.nvmlDeviceGetCurrentClocksThrottleReasons(h))
        if mask is not None:
            f["throttle_reasons"] = mask
            f["throttle"] = decode_throttle(mask)
        for key, kind in (("ecc_corrected", nv.NVML_MEMORY_ERROR_TYPE_CORRECTED),
                          ("ecc_uncorrected", nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)):
            v = self._field(i, key, lambda kind=kind: nv.nvmlDeviceGetTotalEccErrors(h, kind, nv.NVML_VOLATILE_ECC))
            if v is not None:
                f[key] = v
        retired = 0
        got_retired = False
        for cause in (nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
                      nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR):
            pages = self._field(i, "retired_pages", lambda cause=cause: nv.nvmlDeviceGetRetiredPages(h, cause))
            if pages is not None:
                retired += len(pages)
                got_retired = True
        if got_retired:
            f["retired_pages"] = retired
        rows = self._field(i, "remapped_rows", lambda: nv.nvmlDeviceGetRemappedRows(h))
        if rows is not None:
            corr, unc, pending, failed = rows
            f.update(remapped_rows_correctable=corr, remapped_rows_uncorrectable=unc,
                     remap_pending=bool(pending), remap_failed=bool(failed))
        replay = self._field(i, "pcie_replay", lambda: nv.nvmlDeviceGetPcieReplayCounter(h))
        if replay is not None:
            f["pcie_replay"] = replay
        links = self._nvlink_errors(i, h)
        if links:
            f["nvlink_errors"] = links
        return f

    def _nvlink_errors(self, i: int, h: Any) -> list[int]:
        """Per link, the sum of NVLINK_COUNTERS; stops at the first link NVML rejects (no more links)."""
        if "nvlink" in self._unsupported[i]:
            return []
        out: list[int] = []
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            total = 0
            try:
                for counter in NVLINK_COUNTERS:
                    total += pynvml.nvmlDeviceGetNvLinkErrorCounter(h, link, counter)
            except pynvml.NVMLError_GpuIsLost as exc:
                raise _GpuLost from exc
            except (*_SKIP, pynvml.NVMLError_InvalidArgument):
                if link == 0:
                    self._unsupported[i].add("nvlink")
                break
            except pynvml.NVMLError as exc:
                self._count_error(f"nvlink:{type(exc).__name__}", exc, i)
                break
            out.append(total)
        return out[:64]

    def _reading(self, i: int, xid: int = 0) -> GpuHealth | None:
        """GPU `i`'s event for now: a full reading, or `lost=True` on the transition to lost, else None."""
        try:
            fields = self._read(i)
        except _GpuLost:
            with self._lock:
                was_lost, self._lost[i] = self._lost[i], True
            if was_lost and not xid:
                return None
            if not was_lost:
                log.warning("GPU %d (%s) is lost (fell off the bus?)", i, self._uuids[i])
            return GpuHealth(node=self.node, ts_ns=time.time_ns(), gpu=i, uuid=self._uuids[i], lost=True, xid=xid,
                             **_NO_READINGS)
        except pynvml.NVMLError as exc:     # getting the handle failed for another reason
            self._count_error(f"handle:{type(exc).__name__}", exc, i)
            return None
        with self._lock:
            if self._lost[i]:
                log.warning("GPU %d (%s) is back", i, self._uuids[i])
            self._lost[i] = False
        return GpuHealth(node=self.node, ts_ns=time.time_ns(), xid=xid, **fields)

    def _send(self, events: list[GpuHealth]) -> None:
        if not events or self._emit is None:
            return
        with self._lock:
            self.counts[GpuHealth.SCHEMA] += len(events)
        self._emit(list(events))

    # ---- threads ----

    def _poll_loop(self) -> None:
        period = 1.0 / self.hz
        next_tick = time.monotonic()
        while not self._stop.is_set():
            events: list[GpuHealth] = []
            for i in range(len(self._handles)):
                try:
                    ev = self._reading(i)
                except Exception as exc:   # a bug or a validation error must not kill the poller
                    self._count_error(f"poll:{type(exc).__name__}", exc, i)
                    continue
                if ev is not None:
                    events.append(ev)
            try:
                self._send(events)
            except Exception as exc:
                self._count_error(f"emit:{type(exc).__name__}", exc)
            next_tick += period
            now = time.monotonic()
            if next_tick < now:            # fell behind (slow NVML): skip ticks instead of bursting
                next_tick = now
            self._stop.wait(next_tick - now)

    def _register_xid_events(self) -> tuple[Any, dict[int, int]]:
        """An event set with every GPU that supports it registered for XID errors, and a map from handle
        address to GPU index; (None, {}) when no GPU can deliver XID events."""
        try:
            event_set = pynvml.nvmlEventSetCreate()
        except pynvml.NVMLError as exc:
            log.warning("XID events unavailable: nvmlEventSetCreate: %s", exc)
            return None, {}
        registered: dict[int, int] = {}
        for i, h in enumerate(self._handles):
            if h is None:
                continue
            try:
                pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, event_set)
                registered[ctypes.cast(h, ctypes.c_void_p).value or 0] = i
            except pynvml.NVMLError as exc:
                log.info("GPU %d: XID events unavailable: %s", i, exc)
        if not registered:
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlEventSetFree(event_set)
            return None, {}
        return event_set, registered

    def _xid_loop(self) -> None:
        event_set, registered = self._event_set, self._xid_gpus
        while not self._stop.is_set():
            try:
                data = pynvml.nvmlEventSetWait_v2(event_set, XID_WAIT_MS)
            except pynvml.NVMLError_Timeout:
                continue
            except pynvml.NVMLError as exc:
                self._count_error(f"xid_wait:{type(exc).__name__}", exc)
                self._stop.wait(XID_WAIT_MS / 1000)
                continue
            if not data.eventType & pynvml.nvmlEventTypeXidCriticalError:
                continue
            gpu = registered.get(ctypes.cast(data.device, ctypes.c_void_p).value or 0)
            xid = int(data.eventData)
            if gpu is None:
                self._count_error("xid:unknown_device", RuntimeError(f"XID {xid} on an unknown device"))
                continue
            log.warning("GPU %d (%s): XID %d", gpu, self._uuids[gpu], xid)
            try:
                ev = self._reading(gpu, xid=min(xid, 2**32 - 1))
                self._send([ev] if ev is not None else [])
            except Exception as exc:
                self._count_error(f"xid:{type(exc).__name__}", exc, gpu)
