"""Which signals stop a long-running command (`up`, `demo`), and quiet while it stops its children.

SIGINT, SIGTERM and SIGHUP all raise KeyboardInterrupt in the main thread, so one `finally` stops the
children and releases the data dir, whichever came: Ctrl-C, `kill`, a service manager, or the terminal
closing. SIGINT is taken even when started ignored (`cmd &` in a script ignores it); SIGHUP is left
ignored when started ignored, because that is what `nohup` asks for.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def stop_on_signals() -> None:
    """SIGINT, SIGTERM and SIGHUP (unless nohup ignores it) raise KeyboardInterrupt."""
    for sig in STOP_SIGNALS:
        if sig == signal.SIGHUP and signal.getsignal(sig) == signal.SIG_IGN:
            continue
        signal.signal(sig, signal.default_int_handler)


@contextlib.contextmanager
def ignoring_stop_signals() -> Iterator[None]:
    """A second Ctrl-C (or SIGTERM, SIGHUP) must not cut a stop short and leave children behind.

    Outside the main thread signal handlers cannot be changed, and this does nothing."""
    if not _main_thread():
        yield
        return
    before = {sig: signal.signal(sig, signal.SIG_IGN) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
