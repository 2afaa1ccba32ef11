"""GpuSource against a C stub of libnvidia-ml.so.1 (tests/nvml_stub/nvml_stub.c): the real pynvml code path,
with faults injected through the stub's state file ($NVML_STUB_STATE)."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pynvml
import pytest

from clocktower.producers.agent.gpu_source import GpuSource
from clocktower.schemas.event import Event
from clocktower.schemas.telemetry import GpuHealth

STUB_SOURCE = Path(__file__).parent / "nvml_stub" / "nvml_stub.c"
HZ = 50.0

GPU0 = {"gpu": 0, "uuid": "GPU-11111111-2222-3333-4444-555555555555", "temp": 61, "power_mw": 312_500,
        "sm": 1980, "mem": 2619, "util": 87, "memutil": 41, "mem_used": 75_000_000_000,
        "mem_total": 150_000_000_000, "throttle": "0x1", "ecc_corr": 3, "ecc_unc": 0, "retired_sbe": 2,
        "retired_dbe": 0, "remap_corr": 1, "remap_unc": 0, "remap_pending": 0, "remap_failed": 0,
        "pcie_replay": 5, "nvlinks": 4, "nvlink_replay": "0,1,0,0", "nvlink_recovery": "0,0,0,4",
        "nvlink_crc_flit": "0,0,2,0", "nvlink_crc_data": "0,0,1,0"}
GPU1 = {**GPU0, "gpu": 1, "uuid": "GPU-66666666-7777-8888-9999-000000000000", "temp": 58, "power_mw": 298_000,
        "throttle": "0x0", "ecc_corr": 0, "retired_sbe": 0, "remap_corr": 0, "pcie_replay": 0,
        "nvlink_replay": "0,0,0,0", "nvlink_recovery": "0,0,0,0", "nvlink_crc_flit": "0,0,0,0",
        "nvlink_crc_data": "0,0,0,0"}


@pytest.fixture(scope="session")
def stub_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc is not installed: cannot build the NVML stub library")
    out = tmp_path_factory.mktemp("nvml_stub") / "libnvidia-ml.so.1"
    subprocess.run([gcc, "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o", str(out), str(STUB_SOURCE),
                    "-lpthread"], check=True, capture_output=True, text=True, timeout=60)
    return out


class StubState:
    """The stub's state file: `set()` rewrites it atomically (the stub re-reads it on change)."""

    def __init__(self, path: Path, gpus: list[dict]) -> None:
        self.path = path
        self.gpus = [dict(g) for g in gpus]
        self._n = 0
        self.write()

    def write(self) -> None:
        self._n += 1
        tmp = self.path.with_suffix(f".tmp{self._n}")
        tmp.write_text("".join(" ".join(f"{k}={v}" for k, v in g.items()) + "\n" for g in self.gpus))
        os.replace(tmp, self.path)

    def set(self, gpu: int, **fields: object) -> None:
        self.gpus[gpu].update(fields)
        self.write()


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> StubState:
    s = StubState(tmp_path / "nvml_state.txt", [GPU0, GPU1])
    monkeypatch.setenv("NVML_STUB_STATE", str(s.path))
    return s


class Collector:
    """The `emit` callback: records every call (one per tick) and lets a test wait for an event."""

    def __init__(self) -> None:
        self.calls: list[list[Event]] = []
        self._cond = threading.Condition()

    def __call__(self, events: list[Event]) -> None:
        with self._cond:
            self.calls.append(list(events))
            self._cond.notify_all()

    @property
    def events(self) -> list[GpuHealth]:
        with self._cond:
            return [e for call in self.calls for e in call]  # type: ignore[misc]

    def wait_for(self, pred: Callable[[GpuHealth], bool], timeout: float = 3.0, after: int = 0) -> GpuHealth:
        """The first event (from index `after` on) matching `pred`, waiting up to `timeout` s for it."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for e in [e for call in self.calls for e in call][after:]:
                    if pred(e):  # type: ignore[arg-type]
                        return e  # type: ignore[return-value]
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no matching event within {timeout}s; last: {self.events[-3:]}")
                self._cond.wait(left)


@contextmanager
def running(lib: Path, hz: float = HZ) -> Iterator[tuple[GpuSource, Collector]]:
    src = GpuSource("node-a", hz=hz, library_path=str(lib))
    got = Collector()
    src.start(got)
    try:
        yield src, got
    finally:
        src.stop()


# ---- check() ----

def test_check_on_this_machine_says_why_not() -> None:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
        has_driver = True
    except OSError:
        has_driver = False
    avail = GpuSource("node-a").check()
    if has_driver:
        assert avail.ok or "NVML" in avail.reason or "driver" in avail.reason
    else:
        assert avail.ok is False
        assert avail.reason == "NVML library not found (libnvidia-ml.so.1): no NVIDIA driver on this machine"


def test_check_missing_library_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "libnvidia-ml.so.1"
    avail = GpuSource("node-a", library_path=str(missing)).check()
    assert avail == type(avail)(False, f"NVML library not found at {missing}")


def test_check_with_stub(stub_lib: Path, state: StubState) -> None:
    avail = GpuSource("node-a", hz=10, library_path=str(stub_lib)).check()
    assert avail.ok, avail.reason
    assert avail.reason == "2 GPU(s) via NVML, driver 999.99-stub, polled at 10 Hz"
    assert pynvml._nvmlLib_refcount == 0          # check() shut NVML down again


def test_check_with_no_gpus(stub_lib: Path, state: StubState) -> None:
    state.gpus = []
    state.write()
    avail = GpuSource("node-a", library_path=str(stub_lib)).check()
    assert avail.ok is False and "no GPUs" in avail.reason


def test_another_library_in_use_is_refused(stub_lib: Path, state: StubState, tmp_path: Path) -> None:
    other = tmp_path / "other" / "libnvidia-ml.so.1"
    other.parent.mkdir()
    shutil.copy(stub_lib, other)
    with running(stub_lib):
        avail = GpuSource("node-a", library_path=str(other)).check()
    assert avail.ok is False and "already uses the NVML library" in avail.reason
    assert GpuSource("node-a", library_path=str(other)).check().ok   # free to switch once stopped


# ---- readings ----

def test_normal_readings_equal_the_stub_state(stub_lib: Path, state: StubState) -> None:
    with running(stub_lib) as (src, got):
        got.wait_for(lambda e: e.gpu == 1)
        time.sleep(0.1)
    # one emit call per tick, holding both GPUs
    assert len(got.calls) >= 3 and all(sorted(e.gpu for e in call) == [0, 1] for call in got.calls)
    e0 = next(e for e in got.events if e.gpu == 0)
    assert e0 == GpuHealth(
        node="node-a", ts_ns=e0.ts_ns, gpu=0, uuid=GPU0["uuid"], lost=False, temperature_c=61.0, power_w=312.5,
        sm_clock_mhz=1980, mem_clock_mhz=2619, gpu_util_pct=87, mem_util_pct=41, mem_used_bytes=75_000_000_000,
        throttle_reasons=0x1, throttle=["idle"], ecc_corrected=3, ecc_uncorrected=0, xid=0, pcie_replay=5,
        nvlink_errors=[0, 1, 3, 4], retired_pages=2, remapped_rows_correctable=1, remapped_rows_uncorrectable=0,
        remap_pending=False, remap_failed=False)
    assert abs(e0.ts_ns - time.time_ns()) < 10 * 10**9
    e1 = next(e for e in got.events if e.gpu == 1)
    assert (e1.uuid, e1.temperature_c, e1.power_w, e1.throttle, e1.nvlink_errors) == \
        (GPU1["uuid"], 58.0, 298.0, [], [0, 0, 0, 0])
    assert src.counts["gpu_health"] == len(got.events)
    assert not src.errors
    assert pynvml._nvmlLib_refcount == 0
    with pytest.raises(pynvml.NVMLError_Uninitialized):   # stop() shut NVML down (the stub checks)
        pynvml.nvmlDeviceGetCount()


def test_thermal_throttle_is_decoded(stub_lib: Path, state: StubState) -> None:
    with running(stub_lib) as (_, got):
        got.wait_for(lambda e: e.gpu == 0)
        n = len(got.events)
        state.set(0, temp=93, throttle="0x60", sm=1200)
        hot = got.wait_for(lambda e: e.gpu == 0 and e.throttle_reasons != 0x1, after=n)
    assert (hot.throttle_reasons, hot.throttle, hot.temperature_c, hot.sm_clock_mhz) == \
        (0x60, ["sw_thermal", "hw_thermal"], 93.0, 1200)


def test_xid_79_arrives_through_the_event_api(stub_lib: Path, state: StubState) -> None:
    with running(stub_lib) as (src, got):
        got.wait_for(lambda e: e.gpu == 1)
        state.set(1, xid=79, xid_seq=1)
        ev = got.wait_for(lambda e: e.xid != 0)
        time.sleep(0.2)                      # a few more ticks: the XID is reported once, not per poll
    assert (ev.gpu, ev.uuid, ev.xid, ev.lost, ev.temperature_c) == (1, GPU1["uuid"], 79, False, 58.0)
    assert [e.xid for e in got.events if e.xid] == [79]
    assert [len(c) for c in got.calls].count(1) == 1   # the XID went out in its own emit call
    assert not src.errors


def test_uncorrectable_ecc_error(stub_lib: Path, state: StubState) -> None:
    with running(stub_lib) as (_, got):
        got.wait_for(lambda e: e.gpu == 0)
        state.set(0, ecc_unc=2, retired_dbe=1, remap_unc=1, remap_pending=1)
        bad = got.wait_for(lambda e: e.gpu == 0 and e.ecc_uncorrected > 0)
    assert (bad.ecc_uncorrected, bad.ecc_corrected, bad.retired_pages, bad.remapped_rows_uncorrectable,
            bad.remap_pending, bad.remap_failed) == (2, 3, 3, 1, True, False)


def test_gpu_lost_is_reported_once_and_the_other_gpu_keeps_reporting(stub_lib: Path, state: StubState) -> None:
    with running(stub_lib) as (src, got):
        got.wait_for(lambda e: e.gpu == 1)
        state.set(1, lost=1)
        lost = got.wait_for(lambda e: e.lost)
        i = got.events.index(lost)
        for _ in range(5):                   # gpu 0 keeps going, gpu 1 stays silent while lost
            e0 = got.wait_for(lambda e: e.gpu == 0, after=i + 1)
            i = got.events.index(e0)
        between = got.events[got.events.index(lost) + 1:]
        state.set(1, lost=0, temp=40)
        back = got.wait_for(lambda e: e.gpu == 1 and not e.lost, after=len(got.events))
    assert (lost.gpu, lost.uuid, lost.temperature_c, lost.power_w) == (1, GPU1["uuid"], None, None)   # not read
    assert [e for e in got.events if e.lost] == [lost]
    assert {e.gpu for e in between} == {0} and len(between) >= 5
    assert (back.uuid, back.temperature_c) == (GPU1["uuid"], 40.0)
    assert not src.errors                    # a lost GPU is not an "unexpected" error


def test_unsupported_fields_are_null_not_zero(stub_lib: Path, state: StubState) -> None:
    """A reading the GPU cannot give is null: a stored 0 would look like a real reading (0 W, no ECC errors)."""
    state.set(0, unsupported="power,ecc,retired,remap,nvlink,pcie")
    with running(stub_lib) as (src, got):
        e0 = got.wait_for(lambda e: e.gpu == 0)
        e1 = got.wait_for(lambda e: e.gpu == 1)
    assert (e0.power_w, e0.ecc_corrected, e0.retired_pages, e0.remapped_rows_correctable, e0.pcie_replay,
            e0.nvlink_errors) == (None, None, None, None, None, [])
    assert (e0.temperature_c, e0.sm_clock_mhz, e0.throttle) == (61.0, 1980, ["idle"])   # the rest is read
    assert (e1.power_w, e1.nvlink_errors) == (298.0, [0, 0, 0, 0])
    assert not src.errors


def test_unexpected_errors_are_counted_and_the_reading_still_goes_out(stub_lib: Path, state: StubState) -> None:
    state.set(0, fail="temp")
    with running(stub_lib) as (src, got):
        got.wait_for(lambda e: e.gpu == 0)
        e0 = got.wait_for(lambda e: e.gpu == 0, after=2)
    assert (e0.temperature_c, e0.power_w) == (None, 312.5)
    assert set(src.errors) == {"temperature:NVMLError_Unknown"} and src.errors["temperature:NVMLError_Unknown"] >= 2


def test_gpu_lost_before_start(stub_lib: Path, state: StubState) -> None:
    state.set(1, lost=1)
    with running(stub_lib) as (_, got):
        lost = got.wait_for(lambda e: e.gpu == 1)
        got.wait_for(lambda e: e.gpu == 0, after=4)
        state.set(1, lost=0)
        back = got.wait_for(lambda e: e.gpu == 1 and not e.lost)
    assert (lost.lost, lost.uuid) == (True, "gpu-1")      # its UUID was never readable
    assert [e.gpu for e in got.events if e.lost] == [1]
    assert back.uuid == GPU1["uuid"]


def test_stop_is_prompt(stub_lib: Path, state: StubState) -> None:
    src = GpuSource("node-a", hz=1.0, library_path=str(stub_lib))
    got = Collector()
    src.start(got)
    got.wait_for(lambda e: True)
    t = time.monotonic()
    src.stop()
    assert time.monotonic() - t < 1.0
    assert not any(t.is_alive() for t in threading.enumerate() if t.name in ("gpu-poll", "gpu-xid"))
