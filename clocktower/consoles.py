"""The CLI's rich consoles: wrapped to the terminal on a terminal, never wrapped anywhere else.

rich wraps at 80 columns when its output is a pipe or a file, which split `error:` lines and command ids and
broke grep; off a terminal, a line is printed whole (soft wrap), and the terminal, if any, wraps it.
"""

from __future__ import annotations

from rich.console import Console


def console(stderr: bool = False) -> Console:
    """A Console on stdout (or stderr) that wraps only when that is a terminal."""
    out = Console(stderr=stderr)
    if not out.is_terminal:
        out.soft_wrap = True
    return out
