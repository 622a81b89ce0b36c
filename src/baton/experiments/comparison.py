"""``comparison.csv``: one row per policy of a comparison, the figures a person takes away,
with the repeats' 95% intervals.

Columns: ``policy``, ``repeats``, then per metric its mean over the repeats and, with two
repeats or more, ``<metric>_ci95_lo`` / ``_ci95_hi`` (a t-interval of that mean over the
repeats) and, for every policy after the first, ``<metric>_diff_ci95_lo`` / ``_hi`` (the
paired interval of its difference from the first policy, repeat by repeat on the same
workload). Then ``rejected_<reason>`` for every reason any policy rejected requests for.
Empty cells are figures that do not exist (a percentile of no samples).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from baton.experiments.repeats import combine, mean_interval

# the figures of the summary table, then the rest a comparison is usually read for
METRICS = ("finished", "rejected", "p50_ttft_s", "p95_ttft_s", "p99_ttft_s", "mean_tpot_s", "p50_tpot_s",
           "p99_tpot_s", "p99_tbt_s", "mean_e2e_s", "p99_e2e_s", "throughput_tok_s", "throughput_rps",
           "goodput_rps", "slo_attainment", "preemptions", "migrations", "role_changes", "deflected_fraction",
           "load_cv")


def _cell(value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return f"{value:.6g}"


def comparison_rows(runs: Mapping[str, Sequence[Mapping[str, float]]]) -> tuple[list[str], list[list[str]]]:
    """(header, rows) for the policies' summaries, K per policy (one per repeat); after
    ``METRICS``, the rejected requests of every reason any policy rejected for."""
    k = min(len(v) for v in runs.values())
    means, paired = combine(runs)
    reasons = sorted({key for summaries in runs.values() for s in summaries for key in s
                      if key.startswith("rejected_")})
    metrics = METRICS + tuple(reasons)
    header = ["policy", "repeats"]
    for m in metrics:
        header.append(m)
        if k > 1:
            header += [f"{m}_ci95_lo", f"{m}_ci95_hi", f"{m}_diff_ci95_lo", f"{m}_diff_ci95_hi"]
    rows = []
    for name, summaries in runs.items():
        row = [name, str(len(summaries))]
        for m in metrics:
            row.append(_cell(means[name].get(m, 0.0 if m.startswith("rejected_") else None)))
            if k > 1:
                values = np.array([s.get(m, 0.0 if m in reasons else math.nan) for s in summaries], dtype=float)
                lo, hi = mean_interval(values[~np.isnan(values)])
                diff = paired.get(name, {}).get(m, {}).get("ci95", [None, None])
                row += [_cell(lo), _cell(hi), _cell(diff[0]), _cell(diff[1])]
        rows.append(row)
    return header, rows


def write_comparison(path: Path, runs: Mapping[str, Sequence[Mapping[str, float]]]) -> Path:
    """Write ``comparison.csv`` and return its path."""
    header, rows = comparison_rows(runs)
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    return path
