"""Terminal output: summary tables and progress bars (rich; plain text when piped)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from baton.report.table import headers, table_rows


COMPACT_BELOW = 100  # terminal columns under which the table takes its compact form


def summary_table(results: Mapping[str, Mapping[str, float]], title: str,
                  paired: Mapping | None = None, wide: bool = False, width: int | None = None) -> Table:
    """Policies as rows; rows after the first show their change against the first, in %
    (``~``: its paired 95% interval over repeats includes 0). In a terminal narrower than
    ``COMPACT_BELOW`` columns the table drops its vertical rules, the brackets around
    changes and counts that are zero for every policy, so that each policy stays one line
    in 80 columns."""
    compact = not wide and width is not None and width < COMPACT_BELOW
    table = Table(title=title, box=box.SIMPLE_HEAD if compact else box.HEAVY_HEAD,
                  padding=(0, 1), collapse_padding=compact)
    for i, name in enumerate(headers(wide, results, compact)):
        table.add_column(name, justify="left" if i == 0 else "right", no_wrap=i == 0 and compact)
    for policy, cells in table_rows(results, paired, wide, compact):
        table.add_row(policy, *cells)
    return table


def rows_table(title: str, head: list[str], rows: list[list[str]]) -> Table:
    """A plain table: first column left-aligned, the rest right-aligned."""
    table = Table(title=title)
    for i, name in enumerate(head):
        table.add_column(name, justify="left" if i == 0 else "right")
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
