"""`python -m sinks.endpoint`: own a chdb data dir and serve it over ClickHouse HTTP until SIGTERM.

Failures a user can fix (port in use, data dir locked) print one `error:` line and exit 2.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from sinks.endpoint import ChdbEngine, ClickHouseHttpEndpoint, DataDirLocked, PortInUse


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m sinks.endpoint")
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8123)
    args = ap.parse_args()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        engine = ChdbEngine(args.data_dir)
    except DataDirLocked as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    endpoint = ClickHouseHttpEndpoint(engine, args.host, args.port)
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
