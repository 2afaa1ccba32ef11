"""`python -m clocktower.sinks.endpoint`: own a chdb data dir and serve it over ClickHouse HTTP until SIGTERM.

Failures a user can fix (port in use, data dir locked, no credentials file) print one `error:` line
and exit 2. The users come from --credentials (CLOCKTOWER_CREDENTIALS_FILE), the file `clocktower up`
generates; without one the endpoint does not start: there is no built-in login.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path

from clocktower.runtime.credentials import read_users
from clocktower.runtime.errors import UserError
from clocktower.runtime.parent_watch import watch_parent
from clocktower.sinks.endpoint import ChdbEngine, ClickHouseHttpEndpoint, DataDirLocked, PortInUse
from clocktower.sinks.endpoint.auth import User


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m clocktower.sinks.endpoint")
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8123)
    ap.add_argument("--credentials", default=os.environ.get("CLOCKTOWER_CREDENTIALS_FILE"),
                    help="the users file `clocktower up` generates (default: $CLOCKTOWER_CREDENTIALS_FILE)")
    ap.add_argument("--max-connections", type=int, default=32, help="connections served at once")
    ap.add_argument("--allow-host", action="append", default=[], help="another name clients may use in Host")
    args = ap.parse_args()
    watch_parent()
    if not args.credentials:
        print("error: no credentials file: pass --credentials (`clocktower up` generates one in the data dir)",
              file=sys.stderr, flush=True)
        return 2
    try:
        users = {name: User(password, readonly) for name, (password, readonly) in
                 read_users(Path(args.credentials)).items()}
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        engine = ChdbEngine(args.data_dir)
    except DataDirLocked as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    endpoint = ClickHouseHttpEndpoint(engine, args.host, args.port, users=users,
                                      max_connections=args.max_connections, allowed_hosts=tuple(args.allow_host))
    try:
        endpoint.start()
    except PortInUse as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        engine.close()
        return 2
    print(f"serving {args.data_dir} at {endpoint.url}", flush=True)
    stop.wait()
    endpoint.stop()
    engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
