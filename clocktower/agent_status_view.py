"""`clocktower agent`'s source table on stderr, shown at once and updated as each source becomes running,
off or failed: in place on a terminal; elsewhere (a log file, systemd) the table once, then one line per
change, so a log shows when the slow eBPF compile finished."""

from __future__ import annotations

from types import TracebackType

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

STYLE = {"starting": "cyan", "running": "green", "off": "yellow", "failed": "red"}


def _state(s: dict) -> str:
    slow = s["state"] == "running" and s["start_s"] is not None and s["start_s"] >= 0.5
    after = f" after {s['start_s']:.1f} s" if slow else ""
    return f"[{STYLE[s['state']]}]{s['state']}[/]{after}"


def _why(s: dict) -> str:
    return escape(s.get("error") or s["reason"])


def source_table(report: dict) -> Table:
    t = Table(title="clocktower agent sources", title_justify="left")
    for col in ("source", "state", "why"):
        t.add_column(col, overflow="fold")
    for name, s in report["sources"].items():
        t.add_row(name, _state(s), _why(s))
    return t


class SourceTableView:
    """`update(runner.report())` as often as you like; only changes are shown."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self._live: Live | None = None
        self._seen: dict[str, str] | None = None

    def update(self, report: dict) -> None:
        states = {n: s["state"] for n, s in report["sources"].items()}
        if states == self._seen:
            return
        if self.console.is_terminal:
            if self._live is None:
                self._live = Live(source_table(report), console=self.console, auto_refresh=False,
                                  redirect_stdout=False, redirect_stderr=False)
                self._live.start()
            self._live.update(source_table(report), refresh=True)
        elif self._seen is None:
            self.console.print(source_table(report))
        else:
            for name, s in report["sources"].items():
                if states[name] != self._seen.get(name):
                    self.console.print(f"source {name}: {_state(s)}: {_why(s)}", soft_wrap=True)
        self._seen = states

    def __enter__(self) -> SourceTableView:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        if self._live is not None:
            self._live.stop()        # the last table stays on the screen
            self._live = None
