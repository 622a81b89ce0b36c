"""Terminal output: summary tables and progress bars (rich; plain text when piped)."""

from __future__ import annotations

import os
import re
import sys
import textwrap
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from baton.report.table import headers, row_parts


COMPACT_BELOW = 100  # terminal columns under which the table takes its compact form


def summary_table(results: Mapping[str, Mapping[str, float]], title: str,
                  paired: Mapping | None = None, wide: bool = False, width: int | None = None) -> Table:
    """Policies as rows; rows after the first show their change against the first (``+5%``,
    from a doubling ``2.5x``; ``~``: its paired 95% interval over repeats includes 0). In a
    terminal narrower than ``COMPACT_BELOW`` columns the table drops its vertical rules and
    counts that are zero for every policy. Where values and changes side by side would not
    fit ``width``, each policy takes two lines, its changes under its values, so no cell
    wraps and no policy's name is cut."""
    compact = not wide and width is not None and width < COMPACT_BELOW
    parts = row_parts(results, paired, wide, compact)
    names = headers(wide, results, compact)
    beside = [[name, *(t if c is None else (f"{t} {c}" if compact else f"{t} ({c})") for t, c in cells)]
              for name, cells in parts]
    under = width is not None and _width(names, beside, compact) > width
    table = Table(title=title, box=box.SIMPLE_HEAD if compact else box.HEAVY_HEAD,
                  padding=(0, 1), collapse_padding=compact)
    longest = max(map(len, results), default=6)
    cells = beside if not under else [[n, *(t for t, _ in c)] for n, c in parts] + \
        [["", *(c or "" for _, c in cs)] for _, cs in parts]
    # headers wrap at their words only where whole ones would not fit
    wrap = width is not None and _width(names, cells, compact, whole_headers=True) > width
    for i, name in enumerate(names):  # a policy's name is never cut
        fit = max([len(r[i]) for r in cells] + [max(map(len, name.split()), default=1)])
        title = "\n".join(textwrap.wrap(name, fit)) if wrap else name
        table.add_column(title, justify="left" if i == 0 else "right", no_wrap=True,
                         min_width=longest if i == 0 else None)
    for (policy, cells), row in zip(parts, beside):
        if not under:
            table.add_row(*row)
            continue
        table.add_row(policy, *(t for t, _ in cells))
        if any(c is not None for _, c in cells):
            table.add_row("", *(c or "" for _, c in cells), style="dim")
    return table


def _width(head: list[str], rows: list[list[str]], compact: bool, whole_headers: bool = False) -> int:
    """Columns a table of these cells needs on one line each (headers wrapped at their
    words, or ``whole_headers``)."""
    widths = [max([len(h) if whole_headers else max(map(len, h.split()), default=0)] + [len(r[i]) for r in rows])
              for i, h in enumerate(head)]
    return sum(widths) + len(widths) * 2 + (0 if compact else len(widths) + 1)


_NUMERIC = re.compile(r"^[-+~]?[\d.,]+(?:e[-+]?\d+)?\s*(?:%|x|ms|s|req/s)?(?:\s.*)?$|^-$|^>= ?[\d.]+")


def rows_table(title: str, head: list[str], rows: list[list[str]]) -> Table:
    """A plain table: numbers right-aligned, text (any column with a cell that does not
    start as a number) left-aligned."""
    table = Table(title=title)
    for i, name in enumerate(head):
        numeric = i > 0 and all(_NUMERIC.match(str(r[i]).strip()) for r in rows if i < len(r))
        table.add_column(name, justify="right" if numeric else "left")
    for row in rows:
        table.add_row(*row)
    return table


def console() -> Console:
    """A console that writes colour and widths only to terminals."""
    if sys.stdout.isatty():
        return Console()
    # piped: the COLUMNS the user set, else 100; wide tables may need more
    width = int(os.environ["COLUMNS"]) if os.environ.get("COLUMNS", "").isdigit() else 100
    return Console(width=width)


def _bar(*columns) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), *columns, TimeElapsedColumn(),
                    console=Console(stderr=True), transient=True)


@contextmanager
def progress_bar(enabled: bool, label: str, total_s: float) -> Iterator[Callable[[float, int, int], None] | None]:
    """A progress callback over simulated time, shown on stderr only when it is a terminal."""
    if not enabled or not sys.stderr.isatty():
        yield None
        return
    with _bar(TextColumn("{task.fields[done]}")) as bar:
        task = bar.add_task(label, total=max(total_s, 1e-9), done="")

        def update(now_s: float, finished: int, total: int) -> None:
            bar.update(task, completed=min(now_s, total_s), done=f"{finished}/{total} requests")
        yield update


@contextmanager
def points_bar(enabled: bool, label: str, total: int) -> Iterator[Callable[[str, float], None] | None]:
    """A progress callback over finished sweep points."""
    if not enabled or not sys.stderr.isatty():
        yield None
        return
    with _bar(MofNCompleteColumn(), TextColumn("{task.fields[last]}")) as bar:
        task = bar.add_task(label, total=total, last="")

        def update(policy: str, rate_rps: float) -> None:
            bar.update(task, advance=1, last=f"{policy} @ {rate_rps:g} req/s")
        yield update
