"""A service started by `clocktower up` ends within a bound once `up` is gone, even if its shutdown hangs.

`up` gives each child a parent-death signal (clocktower/child_process.py), and the child then shuts down
gracefully. A graceful shutdown can hang when the services it talks to died at the same moment (a final commit
or insert to a broker that is gone), and a child left behind holds ports and the data dir. So each service also
watches its parent: once it has changed (the child was re-parented), the process gets `grace_s` to finish, then
exits hard. A service run by systemd or a container keeps its parent and is never affected.
"""

from __future__ import annotations

import logging
import os
import threading
import time

log = logging.getLogger(__name__)
EXIT_CODE = 70


def watch_parent(grace_s: float = 20.0, poll_s: float = 1.0) -> threading.Thread:
    """Start the watch (a daemon thread); returns it."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        log.warning("parent process %d is gone: exiting within %.0f s", parent, grace_s)
        time.sleep(grace_s)
        log.error("shutdown did not finish within %.0f s of the parent's death: exiting now", grace_s)
        os._exit(EXIT_CODE)

    thread = threading.Thread(target=watch, name="parent-watch", daemon=True)
    thread.start()
    return thread
