"""Terminal output: summary tables and progress bars (rich; plain text when piped)."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

# (summary key, column title, scale, format)
COLUMNS = (
    ("finished", "done", 1, "{:.0f}"), ("rejected", "rej", 1, "{:.0f}"),
    ("p50_ttft_s", "P50 TTFT ms", 1e3, "{:.1f}"), ("p95_ttft_s", "P95 TTFT ms", 1e3, "{:.1f}"),
    ("mean_tpot_s", "mean TPOT ms", 1e3, "{:.2f}"), ("p99_tpot_s", "P99 TPOT ms", 1e3, "{:.2f}"),
    ("tbt_p99_s", "P99 TBT ms", 1e3, "{:.2f}"), ("throughput_tok_s", "tok/s", 1, "{:.0f}"),
    ("goodput_rps", "goodput rps", 1, "{:.2f}"), ("slo_attainment", "SLO %", 100, "{:.1f}"),
    ("preemptions", "preempt", 1, "{:.0f}"), ("load_cv", "load CV", 1, "{:.2f}"),
)


def _cell(value: float, scale: float, fmt: str) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else fmt.format(value * scale)


def summary_table(results: Mapping[str, Mapping[str, float]], title: str) -> Table:
    """Policies as rows; rows after the first show their change against the first, in %."""
    table = Table(title=title)
    table.add_column("policy")
    for _, name, _, _ in COLUMNS:
        table.add_column(name, justify="right")
    base = next(iter(results.values()), {})
    for i, (policy, summary) in enumerate(results.items()):
        cells = []
        for key, _, scale, fmt in COLUMNS:
            text = _cell(summary.get(key), scale, fmt)
            ref = base.get(key)
            if i and ref and key not in ("finished", "rejected", "preemptions") and not math.isnan(ref):
                text += f" ({(summary[key] - ref) / ref * 100:+.0f}%)"
            cells.append(text)
        table.add_row(policy, *cells)
    return table


def console() -> Console:
    """A console that writes colour and widths only to terminals."""
    return Console(width=200 if not sys.stdout.isatty() else None)


@contextmanager
def progress_bar(enabled: bool, label: str, total_s: float) -> Iterator[Callable[[float, int, int], None] | None]:
    """A progress callback over simulated time, shown on stderr only when it is a terminal."""
    if not enabled or not sys.stderr.isatty():
        yield None
        return
    bar = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[done]}"),
                   TimeElapsedColumn(), console=Console(stderr=True), transient=True)
    with bar:
        task = bar.add_task(label, total=max(total_s, 1e-9), done="")
        def update(now_s: float, finished: int, total: int) -> None:
            bar.update(task, completed=min(now_s, total_s), done=f"{finished}/{total} requests")
        yield update
