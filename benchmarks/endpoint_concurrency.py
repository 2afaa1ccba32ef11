"""Do concurrent reads on the embedded endpoint run in parallel? (issue 9, item 9)

Starts the endpoint in a child process (so the clients' threads do not share its GIL), fills a table,
then times one read alone and the same read from 10 threads at once, each on its own keep-alive
connection. Prints one JSON object: ``alone_ms`` (median of sequential runs), ``parallel_10_ms_p50``
(median latency of each request while 10 run together), ``ratio`` (the two divided), and the same for
a trivial ``SELECT 1`` (``trivial_*``: per-request overhead rather than engine work) and for
``SELECT sleep(0.05)`` (``sleep_*``: waits without a core, so its ratio is near 1 only if nothing
serialises requests, however few cores there are), with ``cpus`` and the load average.
A query that keeps cores busy cannot beat about 10 / cores.

    python benchmarks/endpoint_concurrency.py [--rows 2000000] [--rounds 20]
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time

USER = "bench"
QUERY = "SELECT count(), sum(v) FROM bench WHERE id % 7 = 3"
TRIVIAL = "SELECT 1"
SLEEP = "SELECT sleep(0.05)"  # waits without using a core: shows serialisation whatever the core count
PARALLEL = 10


def _serve(data_dir: str) -> None:
    """Child: own ``data_dir`` and serve it on a free port until stdin closes."""
    from clocktower.sinks.endpoint import ChdbEngine, ClickHouseHttpEndpoint
    from clocktower.sinks.endpoint.auth import User

    engine = ChdbEngine(data_dir)
    endpoint = ClickHouseHttpEndpoint(engine, port=0, users={USER: User(os.environ["BENCH_PASSWORD"], False)})
    endpoint.start()
    print(endpoint.port, flush=True)
    sys.stdin.read()
    endpoint.stop()
    engine.close()


class _Conn:
    def __init__(self, port: int, password: str) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        token = base64.b64encode(f"{USER}:{password}".encode()).decode()
        self.headers = {"Authorization": f"Basic {token}"}

    def run(self, sql: str, method: str = "GET") -> float:
        """One request; its latency in ms."""
        started = time.perf_counter()
        if method == "GET":
            from urllib.parse import quote

            self.conn.request("GET", "/?query=" + quote(sql), headers=self.headers)
        else:
            self.conn.request("POST", "/", body=sql.encode(), headers=self.headers)
        response = self.conn.getresponse()
        body = response.read()
        if response.status != 200:
            raise RuntimeError(f"{response.status}: {body[:300]!r}")
        return (time.perf_counter() - started) * 1000


def _alone(conn: _Conn, sql: str, rounds: int) -> float:
    conn.run(sql)
    return statistics.median(conn.run(sql) for _ in range(rounds))


def _parallel(conns: list[_Conn], sql: str, rounds: int) -> float:
    latencies: list[float] = []
    lock = threading.Lock()
    for _ in range(rounds):
        barrier = threading.Barrier(len(conns))

        def work(conn: _Conn, gate: threading.Barrier = barrier) -> None:
            gate.wait()
            ms = conn.run(sql)
            with lock:
                latencies.append(ms)

        threads = [threading.Thread(target=work, args=(c,)) for c in conns]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    return statistics.median(latencies)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--serve", help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help="a smoke run: 20,000 rows, 3 rounds")
    args = ap.parse_args()
    if args.quick:
        args.rows, args.rounds = 20_000, 3
    if args.serve:
        _serve(args.serve)
        return
    password = secrets.token_urlsafe(16)
    with tempfile.TemporaryDirectory(prefix="endpoint-bench-") as data_dir:
        child = subprocess.Popen([sys.executable, __file__, "--serve", data_dir], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True, env={**os.environ, "BENCH_PASSWORD": password})
        try:
            assert child.stdout is not None
            port = int(child.stdout.readline())
            setup = _Conn(port, password)
            setup.run("CREATE TABLE bench (id UInt64, v Float64) ENGINE = MergeTree ORDER BY id", "POST")
            setup.run(f"INSERT INTO bench SELECT number, number * 0.5 FROM numbers({args.rows})", "POST")
            conns = [_Conn(port, password) for _ in range(PARALLEL)]
            figures: dict[str, float | int] = {"cpus": os.cpu_count() or 0, "load_1m": round(os.getloadavg()[0], 2)}
            for prefix, sql in (("", QUERY), ("trivial_", TRIVIAL), ("sleep_", SLEEP)):
                alone = _alone(setup, sql, args.rounds)
                parallel = _parallel(conns, sql, args.rounds)
                figures[f"{prefix}alone_ms"] = round(alone, 2)
                figures[f"{prefix}parallel_10_ms_p50"] = round(parallel, 2)
                figures[f"{prefix}ratio"] = round(parallel / alone, 2)
        finally:
            if child.stdin is not None:
                child.stdin.close()
            child.wait(timeout=60)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
