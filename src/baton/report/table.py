"""The summary table's cells, shared by the terminal and HTML renderings."""

from __future__ import annotations

import math
from collections.abc import Mapping

from baton.experiments.repeats import includes_zero

# (summary key, column title, scale, format)
COLUMNS = (
    ("finished", "done", 1, "{:.0f}"), ("rejected", "rej", 1, "{:.0f}"),
    ("p50_ttft_s", "P50 TTFT ms", 1e3, "{:.1f}"), ("p95_ttft_s", "P95 TTFT ms", 1e3, "{:.1f}"),
    ("mean_tpot_s", "mean TPOT ms", 1e3, "{:.2f}"), ("p99_tpot_s", "P99 TPOT ms", 1e3, "{:.2f}"),
    ("p99_tbt_s", "P99 TBT ms", 1e3, "{:.2f}"), ("throughput_tok_s", "tok/s", 1, "{:.0f}"),
    ("goodput_rps", "goodput rps", 1, "{:.2f}"), ("slo_attainment", "SLO %", 100, "{:.1f}"),
    ("preemptions", "preempt", 1, "{:.0f}"), ("migrations", "migr", 1, "{:.0f}"),
    ("load_cv", "load CV", 1, "{:.2f}"),
)
# The default terminal table (fits 100 columns); --wide and the HTML report show COLUMNS.
NARROW = ("rejected", "p95_ttft_s", "p99_tpot_s", "goodput_rps", "slo_attainment", "preemptions", "migrations")
# Counts, shown without a percentage change.
ABSOLUTE = {"finished", "rejected", "preemptions", "migrations"}


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def cell(value, scale: float, fmt: str) -> str:
    """A value in its column's format; from 10,000 on without decimals (they only cost width)."""
    if _missing(value):
        return "-"
    return f"{value * scale:.0f}" if abs(value * scale) >= 10_000 else fmt.format(value * scale)


def change_pct(value, ref) -> float | None:
    """Relative change of ``value`` against ``ref``, in percent; None when undefined."""
    if _missing(value) or _missing(ref) or ref == 0:
        return None
    return (value - ref) / abs(ref) * 100


def change_text(pct: float) -> str:
    """A change for a table cell: a percentage, or from a doubling on a ratio (``2.5x``,
    ``168x``), so that a row against an overloaded or tiny first row keeps its width."""
    ratio = 1.0 + pct / 100
    if ratio >= 10:
        return f"{ratio:,.0f}x"
    if ratio >= 2:
        return f"{ratio:.1f}x"
    return f"{pct:+.0f}%"


def _columns(wide: bool, results: Mapping[str, Mapping[str, float]] | None = None, compact: bool = False):
    """The columns shown: all (``wide``), or those of ``NARROW``; ``compact`` also leaves
    out counts that are zero for every policy (they say nothing and cost width)."""
    cols = COLUMNS if wide else tuple(c for c in COLUMNS if c[0] in NARROW)
    if compact and results:
        cols = tuple(c for c in cols if c[0] not in ABSOLUTE or any(s.get(c[0]) for s in results.values()))
    return cols


def row_parts(results: Mapping[str, Mapping[str, float]],
              paired: Mapping[str, Mapping[str, Mapping]] | None = None,
              wide: bool = True, compact: bool = False) -> list[tuple[str, list[tuple[str, str | None]]]]:
    """One row per policy: each cell's value and, for rows after the first, its change
    against the first (``change_text``), marked ``~`` when the paired 95% interval of the
    difference (over repeats) includes 0; counts carry no change."""
    base = next(iter(results.values()), {})
    rows = []
    for i, (policy, summary) in enumerate(results.items()):
        cells: list[tuple[str, str | None]] = []
        for key, _, scale, fmt in _columns(wide, results, compact):
            pct = change_pct(summary.get(key), base.get(key)) if i and key not in ABSOLUTE else None
            entry = (paired or {}).get(policy, {}).get(key)
            change = None if pct is None else ("~" if includes_zero(entry) else "") + change_text(pct)
            cells.append((cell(summary.get(key), scale, fmt), change))
        rows.append((policy, cells))
    return rows


def table_rows(results: Mapping[str, Mapping[str, float]],
               paired: Mapping[str, Mapping[str, Mapping]] | None = None,
               wide: bool = True, compact: bool = False) -> list[tuple[str, list[str]]]:
    """``row_parts`` with each change beside its value: ``12.0 (+5%)``, or ``12.0 +5%``
    when ``compact``. ``wide=False`` keeps the columns that fit a 100-column terminal;
    ``compact`` also drops all-zero counts, to fit 80 columns."""
    return [(policy, [text if change is None else (f"{text} {change}" if compact else f"{text} ({change})")
                      for text, change in cells]) for policy, cells in row_parts(results, paired, wide, compact)]


def headers(wide: bool = True, results: Mapping[str, Mapping[str, float]] | None = None,
            compact: bool = False) -> list[str]:
    return ["policy"] + [title for _, title, _, _ in _columns(wide, results, compact)]
