"""Compiling BPF programs with BCC: finding kernel headers, and one compile at a time.

The agent's sources (producers/agent/ebpf/) and the actuator's flow redirect (actuators/kernel_redirector.py)
both compile C with BCC against the kernel's headers. BCC (Debian's python3-bpfcc) is imported lazily, so this
module imports on any machine. `clocktower agent setup-ebpf` (in a checkout: `make setup-ebpf`) makes a Debian
machine ready: producers/agent/ebpf/setup_bcc.sh, shipped in the package.
"""

from __future__ import annotations

import os
import platform
import threading
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SETUP_HINT = "run `clocktower agent setup-ebpf` as root (in a checkout: make setup-ebpf)"


def headers_cache() -> Path:
    """Where setup_bcc.sh unpacks kernel headers: $CLOCKTOWER_HEADERS_CACHE, else the checkout's
    .cache/kernel-headers, else (installed from the wheel) /var/cache/clocktower/kernel-headers."""
    env = os.environ.get("CLOCKTOWER_HEADERS_CACHE")
    if env:
        return Path(env)
    if (REPO / "pyproject.toml").is_file():
        return REPO / ".cache" / "kernel-headers"
    return Path("/var/cache/clocktower/kernel-headers")


_compile_lock = threading.Lock()         # BCC_KERNEL_SOURCE is process-wide; compile one program at a time


def _headers_ok(path: Path) -> bool:
    return (path / "include" / "linux" / "kconfig.h").is_file() and (
        path / "include" / "generated" / "autoconf.h").is_file()


def find_kernel_source(explicit: str | os.PathLike[str] | None = None) -> tuple[Path | None, str]:
    """The kernel headers tree to compile against, and where it came from (or why none was found).

    Order: `explicit` (no fallback when given), $BCC_KERNEL_SOURCE, the running kernel's own headers
    (/lib/modules/$(uname -r)/build, what real nodes use), then the newest tree that
    setup_bcc.sh unpacked into `headers_cache()`.
    """
    if explicit is not None:
        path = Path(explicit)
        if _headers_ok(path):
            return path, f"kernel_source={path}"
        return None, (f"kernel headers not found at kernel_source={path} (no include/linux/kconfig.h and "
                      f"include/generated/autoconf.h there)")
    env = os.environ.get("BCC_KERNEL_SOURCE")
    if env:
        if _headers_ok(Path(env)):
            return Path(env), f"BCC_KERNEL_SOURCE={env}"
        return None, f"BCC_KERNEL_SOURCE={env} holds no kernel headers (no include/linux/kconfig.h); {SETUP_HINT}"
    build = Path("/lib/modules") / platform.release() / "build"
    if _headers_ok(build):
        return build, str(build)
    cache = headers_cache()
    cached = sorted((p for p in cache.glob("linux-headers-*") if _headers_ok(p)),
                    key=lambda p: [int(x) if x.isdigit() else 0 for x in p.name.replace("-", ".").split(".")])
    if cached:
        return cached[-1], str(cached[-1])
    return None, (f"no kernel headers: {build} is missing, BCC_KERNEL_SOURCE is unset and {cache} is "
                  f"empty; {SETUP_HINT}")


def compile_bpf(text: str, kernel_source: Path, cflags: list[str]) -> Any:
    """BPF(text=...) against `kernel_source`; autoloads and attaches TRACEPOINT_PROBEs."""
    from bcc import BPF

    with _compile_lock:
        saved = os.environ.get("BCC_KERNEL_SOURCE")
        os.environ["BCC_KERNEL_SOURCE"] = str(kernel_source)
        try:
            return BPF(text=text.encode(), cflags=cflags)
        finally:
            if saved is None:
                os.environ.pop("BCC_KERNEL_SOURCE", None)
            else:
                os.environ["BCC_KERNEL_SOURCE"] = saved


def bcc_problem() -> str | None:
    """Why BCC cannot be used here, or None."""
    try:
        import bcc  # noqa: F401
    except ImportError as exc:
        return f"BCC is not importable ({exc}); {SETUP_HINT}"
    except OSError as exc:                              # libbcc.so missing
        return f"BCC cannot load libbcc ({exc}); {SETUP_HINT}"
    return None
