"""The live status shown while the pipeline runs (rich)."""

from __future__ import annotations

from collections.abc import Mapping

from rich.console import Group
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table


class ProgressView:
    def __init__(self, duration_s: float | None) -> None:
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[status]}"),
                                 TimeElapsedColumn())
        self.task = self.progress.add_task("simulated fleet", total=duration_s or None, status="starting")
        self.produced: Mapping[str, int] = {}
        self.rows: Mapping[str, int] = {}
        self.notes: list[str] = []

    def update(self, elapsed: float, status: str, produced: Mapping[str, int] | None = None,
               rows: Mapping[str, int] | None = None) -> None:
        self.progress.update(self.task, completed=elapsed, status=status)
        if produced is not None:
            self.produced = dict(produced)
        if rows is not None:
            self.rows = dict(rows)

    def __rich__(self) -> Group:
        produced = Table(title="events produced", show_edge=False)
        produced.add_column("schema")
        produced.add_column("events", justify="right")
        for k, v in sorted(self.produced.items()):
            produced.add_row(k, f"{v:,}")
        rows = Table(title="rows in ClickHouse", show_edge=False)
        rows.add_column("table")
        rows.add_column("rows", justify="right")
        for k, v in sorted(self.rows.items()):
            rows.add_row(k, f"{v:,}")
        grid = Table.grid(padding=(0, 4))
        grid.add_row(produced, rows)
        return Group(self.progress, grid, *self.notes[-5:])
