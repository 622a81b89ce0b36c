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
    return "-" if _missing(value) else fmt.format(value * scale)


def change_pct(value, ref) -> float | None:
    """Relative change of ``value`` against ``ref``, in percent; None when undefined."""
    if _missing(value) or _missing(ref) or ref == 0:
        return None
    return (value - ref) / abs(ref) * 100


def _columns(wide: bool, results: Mapping[str, Mapping[str, float]] | None = None, compact: bool = False):
    """The columns shown: all (``wide``), or those of ``NARROW``; ``compact`` also leaves
    out counts that are zero for every policy (they say nothing and cost width)."""
    cols = COLUMNS if wide else tuple(c for c in COLUMNS if c[0] in NARROW)
    if compact and results:
        cols = tuple(c for c in cols if c[0] not in ABSOLUTE or any(s.get(c[0]) for s in results.values()))
    return cols


def table_rows(results: Mapping[str, Mapping[str, float]],
               paired: Mapping[str, Mapping[str, Mapping]] | None = None,
               wide: bool = True, compact: bool = False) -> list[tuple[str, list[str]]]:
    """One row per policy; rows after the first carry their change against the first,
    marked ``~`` when the paired 95% interval of the difference (over repeats) includes 0.
    ``wide=False`` keeps the columns that fit a 100-column terminal; ``compact`` writes
    the change without brackets and drops all-zero counts, to fit 80 columns."""
    base = next(iter(results.values()), {})
    rows = []
    for i, (policy, summary) in enumerate(results.items()):
        cells = []
        for key, _, scale, fmt in _columns(wide, results, compact):
            text = cell(summary.get(key), scale, fmt)
            pct = change_pct(summary.get(key), base.get(key)) if i and key not in ABSOLUTE else None
            entry = (paired or {}).get(policy, {}).get(key)
            mark = "~" if includes_zero(entry) else ""
            if pct is None:
                cells.append(text)
            else:
                cells.append(f"{text} {mark}{pct:+.0f}%" if compact else f"{text} ({mark}{pct:+.0f}%)")
        rows.append((policy, cells))
    return rows


def headers(wide: bool = True, results: Mapping[str, Mapping[str, float]] | None = None,
            compact: bool = False) -> list[str]:
    return ["policy"] + [title for _, title, _, _ in _columns(wide, results, compact)]
