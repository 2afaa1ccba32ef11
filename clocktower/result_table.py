"""Query results as a terminal table that never shortens a value: wider than the terminal, it is not cut."""

from __future__ import annotations

import re
from collections.abc import Sequence

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from clocktower import consoles

# Types whose values line up on the right, as numbers do; Nullable/LowCardinality wrappers included.
_NUMERIC = re.compile(r"^(?:(?:Nullable|LowCardinality)\()*(?:U?Int\d+|Float\d+|BFloat16|Decimal\d*)\b")


def print_table(names: Sequence[str], cells: Sequence[Sequence[str]], types: Sequence[str] | None = None,
                console: Console | None = None) -> None:
    """`cells` are the server's text for each value; they are shown as plain text (no rich markup), in full."""
    table = Table()
    for i, name in enumerate(names):
        numeric = types is not None and bool(_NUMERIC.match(types[i]))
        table.add_column(Text(name), justify="right" if numeric else "left", no_wrap=True, overflow="fold")
    for row in cells:
        table.add_row(*(Text(v) for v in row))
    console = console or consoles.console()
    needed = Measurement.get(console, console.options.update_width(1 << 20), table).maximum
    if needed > console.width:  # rich would shrink the columns and cut values: print it at its natural width
        console = Console(width=needed, file=console.file, force_terminal=console.is_terminal,
                          color_system=console.color_system, no_color=console.no_color)
    console.print(table, crop=False)
