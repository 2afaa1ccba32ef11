"""Compression per table: the models' codecs against ClickHouse's default (LZ4), on a simulated fleet. Prints JSON.

A simulated run (every kind of fault) goes through the stream processors in memory, and its raw and derived rows
are inserted into each table as the sink makes it (schemas/clickhouse_ddl.py: ZSTD(1), Delta for timestamps,
DoubleDelta for sequence numbers). A copy of each table without codecs gets the same rows. Both are merged into
one wide part (as a large production part is, where each column is its own compressed file) and their
system.parts sizes compared.

Figures: per table, rows, bytes uncompressed, bytes with LZ4 and with the codecs, and the ratios; in total, the
ratio of uncompressed to stored bytes with the codecs (`compression_ratio`) and how much smaller the codecs store
than LZ4 (`codecs_vs_lz4`, LZ4 bytes / codec bytes). Simulated data is more regular than a real fleet's (round
readings, steady rates): the ratios are an upper bound of what production sees, the comparison between codecs
is the figure to take.

Usage: python benchmarks/storage.py [--quick] [--seconds S] [--nodes N]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # noqa: E402

from clocktower.config import Settings  # noqa: E402
from clocktower.control.signing import CommandSigner  # noqa: E402
from clocktower.ports import free_port  # noqa: E402
from clocktower.producers.simulator.config import SimConfig  # noqa: E402
from clocktower.producers.simulator.fleet import FleetSimulator  # noqa: E402
from clocktower.runtime.clickhouse_client import http_client  # noqa: E402
from clocktower.schemas.clickhouse_ddl import create_table_sql, without_codecs  # noqa: E402
from clocktower.schemas.columns import model_columns  # noqa: E402
from clocktower.schemas.topics import BY_MODEL, TOPICS  # noqa: E402
from clocktower.sinks.clickhouse.batch_set import BatchSet  # noqa: E402
from clocktower.sinks.clickhouse.table_writer import TableWriter  # noqa: E402
from clocktower.stack import Stack  # noqa: E402
from clocktower.streams.processors import Processors  # noqa: E402

MIN_ROWS = 100   # tables with fewer rows are listed but left out of the totals: their parts are mostly headers


def simulate(seconds: int, nodes: int) -> list:
    start_ns = time.time_ns() - (seconds + 5) * 10**9
    sim = FleetSimulator(SimConfig(nodes=nodes, duration_s=seconds, seed=11), start_ns=start_ns)
    processors = Processors(CommandSigner(Ed25519PrivateKey.generate()), clock_ns=lambda: sim.now_ns)
    events: list = []
    for step in range(1, 4 * seconds + 1):
        batch = sim.advance(start_ns + step * 250_000_000)
        events += batch
        events += processors.on_batch(batch)
        if step % 40 == 0:
            print(f"simulated {step // 4} of {seconds} s: {len(events)} rows", file=sys.stderr)
    return events


def _without_codecs(ddl: str, table: str) -> str:
    return without_codecs(ddl).replace(f"`{table}`", f"`{table}_lz4`", 1)


def measure(client, events: list) -> dict:  # noqa: ANN001
    writer = TableWriter(client)
    writer.ensure_schema()
    batches = BatchSet()
    for offset, e in enumerate(events):
        batches.add(BY_MODEL[type(e)].name, 0, offset, [e])
    for batch in batches.take()[0]:
        writer.insert(batch)
    tables = {}
    for spec in TOPICS:
        client.command(_without_codecs(create_table_sql(spec)[0], spec.table))
        cols = ", ".join(f"`{c.name}`" for c in model_columns(spec.model)) + ", `_partition`, `_offset`, `_topic`, " \
                                                                            "`_node_mac`"
        client.command(f"INSERT INTO `{spec.table}_lz4` ({cols}) SELECT {cols} FROM `{spec.table}`")
        sizes = {}
        for name in (spec.table, f"{spec.table}_lz4"):
            client.command(f"ALTER TABLE `{name}` MODIFY SETTING min_bytes_for_wide_part = 0")
            client.command(f"OPTIMIZE TABLE `{name}` FINAL")
            sizes[name] = client.query(
                "SELECT sum(rows), sum(data_uncompressed_bytes), sum(data_compressed_bytes) FROM system.parts "
                "WHERE active AND database = currentDatabase() AND table = {t:String}", parameters={"t": name}
            ).result_rows[0]
        rows, raw, codec = sizes[spec.table]
        lz4 = sizes[f"{spec.table}_lz4"][2]
        tables[spec.table] = {"rows": int(rows), "uncompressed_bytes": int(raw), "lz4_bytes": int(lz4),
                              "codec_bytes": int(codec), "ratio_lz4": round(raw / lz4, 2) if lz4 else None,
                              "ratio_codecs": round(raw / codec, 2) if codec else None,
                              "codecs_vs_lz4": round(lz4 / codec, 2) if codec else None}
    counted = [t for t in tables.values() if t["rows"] >= MIN_ROWS]
    raw, lz4, codec = (sum(t[k] for t in counted) for k in ("uncompressed_bytes", "lz4_bytes", "codec_bytes"))
    return {"tables": tables, "compression_ratio": round(raw / codec, 2), "compression_ratio_lz4": round(raw / lz4, 2),
            "codecs_vs_lz4": round(lz4 / codec, 2), "rows": sum(t["rows"] for t in counted)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10 s of 4 nodes: a smoke run")
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--nodes", type=int, default=8)
    args = parser.parse_args()
    seconds, nodes = (10, 4) if args.quick else (args.seconds, args.nodes)
    events = simulate(seconds, nodes)
    with tempfile.TemporaryDirectory(prefix="ct-storage-") as root:
        settings = Settings(data_dir=Path(root), kafka_port=free_port(), http_port=free_port(), kafka_bootstrap=None,
                            clickhouse_url=None, log_trim_s=0.0)
        stack = Stack(settings, with_streams=False, with_sink=False)
        stack.start()
        try:
            figures = measure(http_client(settings.clickhouse, *settings.clickhouse_login()), events)
        finally:
            stack.stop()
    print(json.dumps({"seconds": seconds, "nodes": nodes, **figures}))


if __name__ == "__main__":
    main()
