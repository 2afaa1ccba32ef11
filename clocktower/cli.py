"""The `clocktower` command line. Thin: each command hands off to its module."""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import os
import signal
import sys
import time
from pathlib import Path

import orjson
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape

from clocktower import agent_cli, consoles, control_cli
from clocktower.config import Settings
from clocktower.runtime.errors import UserError
from clocktower.shutdown_signals import STOP_SIGNALS, stop_on_signals


def _settings(args: argparse.Namespace) -> Settings:
    overrides = {k: v for k, v in (("data_dir", args.data_dir), ("kafka_port", args.kafka_port),
                                   ("http_port", args.http_port),
                                   ("streams_workers", getattr(args, "streams_workers", None))) if v is not None}
    return Settings(**overrides)

DISTRIBUTION = "clocktower-telemetry"   # pyproject.toml's name


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-dir", type=Path, help="where data lives (default .clocktower/, or CLOCKTOWER_DATA_DIR)")
    p.add_argument("--kafka-port", type=int, help="embedded broker port (default 9092)")
    p.add_argument("--http-port", type=int, help="embedded ClickHouse HTTP port (default 8123)")


def _streams_workers(p: argparse.ArgumentParser) -> None:
    p.add_argument("--streams-workers", type=int, help="stream worker processes sharing the partitions "
                   "(default 1, or CLOCKTOWER_STREAMS_WORKERS)")


def _version() -> str:
    """The installed distribution's version (a checkout run without installing it has none)."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="clocktower", description="GPU-cluster telemetry and remediation pipeline")
    ap.add_argument("--version", action="version", version=f"clocktower {_version()}")
    sub = ap.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="run the pipeline on a simulated fleet with injected faults")
    d.add_argument("--duration", type=float, default=60.0, help="simulated seconds (default 60)")
    d.add_argument("--nodes", type=int, default=4, help="nodes of 8 GPUs (default 4)")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    _streams_workers(d)
    _common(d)
    u = sub.add_parser("up", help="run the services until Ctrl-C")
    _streams_workers(u)
    _common(u)
    q = sub.add_parser("query", help="run SQL against the pipeline's ClickHouse")
    q.add_argument("sql", help="the SQL, or - to read it from stdin; with its own FORMAT clause, the server's "
                   "output is printed as it is")
    q.add_argument("--format", choices=("table", "json", "csv"), default="table",
                   help="table (default), json (one array of objects) or csv (with a header line)")
    _common(q)
    e = sub.add_parser("explain", help="why an iteration was slow: the rank waited for, the cause, the evidence")
    e.add_argument("--job", help="the job (default: the one judged last)")
    when = e.add_mutually_exclusive_group()
    when.add_argument("--iteration", type=int, help="this iteration (default: the job's worst moments)")
    when.add_argument("--since", help="only iterations that began since then: 15m, 2h, 1d ago, or an ISO time (UTC)")
    e.add_argument("--limit", type=int, default=3, help="worst moments explained without --iteration (default 3)")
    e.add_argument("--json", action="store_true", help="print one JSON object: the sentences and their evidence")
    _common(e)
    r = sub.add_parser("report", help="one self-contained HTML file with charts: iterations and stragglers, "
                       "one-way delay per link, GPU temperature and throttling, incidents and actions")
    r.add_argument("--out", type=Path, required=True, help="the HTML file to write (replaced if it exists)")
    r.add_argument("--job", help="the job (default: the one judged last)")
    r.add_argument("--since", help="only from then: 15m, 2h, 1d ago, or an ISO time (UTC); default: all of the job")
    _common(r)
    s = sub.add_parser("schema", help="print the DDL a fresh ClickHouse database gets (the sink runs it at start)")
    s.add_argument("--cluster", help="the ON CLUSTER form: ReplicatedMergeTree <table>_local per shard, and "
                   "<table> as a Distributed table (the sink's CLOCKTOWER_CLICKHOUSE_CLUSTER)")
    s.add_argument("--database", default="default", help="the database (default: default)")
    t = sub.add_parser("topics", help="consumer lag per group, topic and partition: end offset - committed")
    t.add_argument("--json", action="store_true")
    _common(t)
    agent_cli.add_parser(sub)
    control_cli.add_parser(sub, _common)
    return ap


def cmd_demo(args: argparse.Namespace, console: Console) -> int:
    from clocktower.demo import run_demo
    from clocktower.summary_view import render_summary

    if args.duration <= 0 or args.nodes < 2:
        raise UserError("--duration must be > 0 and --nodes at least 2")
    out = console if not args.json else consoles.console(stderr=True)
    stop_on_signals()                  # SIGTERM and SIGHUP end the demo as Ctrl-C does: children stopped
    summary = run_demo(_settings(args), args.duration, args.nodes, out, seed=args.seed)
    if args.json:
        print(orjson.dumps(summary).decode())
    else:
        if not console.is_terminal:  # rich ends a live display with a newline only on a terminal
            console.line()
        console.print(render_summary(summary))
    return 0 if not summary["errors"] else 1


def cmd_up(args: argparse.Namespace, console: Console) -> int:
    from clocktower.query import open_client
    from clocktower.stack import Stack
    from clocktower.summary import table_rows

    settings = _settings(args)
    # Stop cleanly on SIGTERM and SIGHUP too, and on SIGINT even when started with it ignored (`cmd &` in a
    # script): the children, each in its own session, are stopped in order and the data dir released.
    stop_on_signals()
    stack = Stack(settings, sign_records=True)   # the streams act only on records their node signed
    stack.start(on_step=lambda msg: console.print(f"[dim]•[/dim] {msg}"))
    console.print(f"[green]up[/green]: Kafka {settings.bootstrap}, ClickHouse {settings.clickhouse}, "
                  f"data {stack.data_dir}. Ctrl-C stops.")
    try:
        client = open_client(settings)
        with console.status("running") as status:
            while True:
                for name in stack.supervise():
                    console.print(f"[yellow]{name} crashed and was restarted[/yellow]")
                try:
                    rows = sum(table_rows(client).values())
                    status.update(f"running: {rows:,} rows stored")
                except Exception as exc:  # the tables appear when the sink starts
                    status.update(f"running ({type(exc).__name__})")
                time.sleep(2)
    except KeyboardInterrupt:
        with contextlib.suppress(OSError):  # after SIGHUP the terminal may be gone
            console.print("stopping…")
    finally:
        for sig in STOP_SIGNALS:  # a second Ctrl-C must not leave children behind
            signal.signal(sig, signal.SIG_IGN)
        stack.stop()
    return 0


def cmd_query(args: argparse.Namespace, console: Console) -> int:
    from clocktower.query import run_query

    sql = sys.stdin.read() if args.sql == "-" else args.sql
    run_query(_settings(args), sql, args.format, console)
    return 0


def cmd_explain(args: argparse.Namespace, console: Console) -> int:
    from clickhouse_connect.driver.exceptions import ClickHouseError

    from clocktower.explain import as_json, narrate
    from clocktower.explain_query import explain, iterations, latest_job, parse_since
    from clocktower.query import open_client

    if args.limit < 1:
        raise UserError("--limit must be at least 1")
    since = parse_since(args.since) if args.since else None
    try:
        client = open_client(_settings(args))
        job = args.job or latest_job(client)
        found = [explain(client, it) for it in iterations(client, job, args.iteration, since, args.limit)]
    except ClickHouseError as exc:
        raise UserError(str(exc).strip().splitlines()[0]) from None
    if args.json:
        print(orjson.dumps({"job": job, "iterations": [as_json(e) for e in found]}).decode())
        return 0
    for n, e in enumerate(found):
        if n:
            console.print()
        for i, line in enumerate(narrate(e)):
            console.print(("" if i == 0 else "  - ") + line, highlight=False, markup=False)
    return 0


def cmd_topics(args: argparse.Namespace, console: Console) -> int:
    from clocktower.result_table import print_table
    from clocktower.running_broker import running_bootstrap
    from clocktower.topic_admin import consumer_lag

    rows = consumer_lag(running_bootstrap(_settings(args)))
    if args.json:
        print(orjson.dumps(rows).decode())
    else:
        names = ["group", "topic", "partition", "end", "committed", "lag"]
        print_table(names, [["-" if r[n] is None else str(r[n]) for n in names] for r in rows],
                    ["String", "String", "Int32", "Int64", "Int64", "Int64"], console)
    return 0


def cmd_report(args: argparse.Namespace, console: Console) -> int:
    from datetime import UTC, datetime

    from clickhouse_connect.driver.exceptions import ClickHouseError

    from clocktower.explain import narrate
    from clocktower.explain_query import explain, iterations, latest_job, parse_since
    from clocktower.query import open_client
    from clocktower.report import render_report
    from clocktower.report_query import STRAGGLER, read_report

    since = parse_since(args.since) if args.since else None
    try:
        client = open_client(_settings(args))
        job = args.job or latest_job(client)
        data = read_report(client, job, since)
        worst = [explain(client, it) for it in iterations(client, job, None, since, 3) if it.slowdown >= STRAGGLER]
    except ClickHouseError as exc:
        raise UserError(str(exc).strip().splitlines()[0]) from None
    page = render_report(data, [narrate(e) for e in worst], datetime.now(UTC))
    out = args.out.expanduser()
    if out.is_dir():
        raise UserError(f"--out {out} is a directory: name the HTML file")
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        tmp.write_text(page, encoding="utf-8")
        tmp.replace(out)
    except OSError as exc:
        raise UserError(f"cannot write {out}: {exc.strerror or exc}") from None
    console.print(f"wrote {out} ({len(page.encode()) / 1e6:.1f} MB): {len(data.iterations)} iterations of {job}, "
                  f"{len(data.incidents)} incidents, {len(data.commands)} commands", highlight=False, markup=False)
    return 0


def cmd_schema(args: argparse.Namespace, console: Console) -> int:
    from clocktower.schemas.clickhouse_ddl import Layout
    from clocktower.schemas.migrations import fresh_install_sql

    try:
        layout = Layout(args.database, args.cluster)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    print(";\n\n".join(fresh_install_sql(layout)) + ";")
    return 0


def cmd_control(args: argparse.Namespace, console: Console) -> int:
    return control_cli.cmd_control(args, _settings(args) if hasattr(args, "data_dir") else Settings(), console)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    console = consoles.console()
    handler = {"demo": cmd_demo, "up": cmd_up, "query": cmd_query, "topics": cmd_topics, "explain": cmd_explain,
               "schema": cmd_schema, "report": cmd_report, "agent": agent_cli.cmd_agent,
               "control": cmd_control}[args.command]
    try:
        return handler(args, console)
    except UserError as exc:
        _error(str(exc))
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(part) for part in err["loc"])
        _error(f"bad configuration {where}: {err['msg'].removeprefix('Value error, ')}")
    except KeyboardInterrupt:  # Ctrl-C while `up` starts (its stack stopped what it started) or in a query
        return 130
    except BrokenPipeError:    # `clocktower schema | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # no second error when Python flushes
        return 0
    return 2


def _error(msg: str) -> None:
    """One `error:` line on stderr, never wrapped or styled by rich."""
    Console(stderr=True, soft_wrap=True).print(f"[red]error:[/red] {escape(msg)}", highlight=False)


if __name__ == "__main__":
    sys.exit(main())
