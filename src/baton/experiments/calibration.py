"""Calibration of the survival estimator (SIBYL Figure 7's metric).

The estimator learns online from the first part of a workload's completions (in arrival
order); its conditional survival Ŝ(b)/Ŝ(a) is then compared with the empirical
P(L > b | L > a) of the held-out rest, over a grid of current lengths a and target
lengths b > a. Grid cells where fewer than ``min_support`` held-out requests reach a are
left out: their empirical value is noise.
"""

from __future__ import annotations

import numpy as np

from baton.predict.survival import SurvivalTable


def empirical_conditional(lengths: np.ndarray, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(P(L > b | L > a), count of L > a) from samples, elementwise over a and b."""
    srt = np.sort(lengths)
    above_a = srt.size - np.searchsorted(srt, a, side="right")
    above_b = srt.size - np.searchsorted(srt, b, side="right")
    return np.where(above_a > 0, above_b / np.maximum(above_a, 1), np.nan), above_a


def survival_calibration(output_tokens: np.ndarray, delta_tokens: int = 64, alpha: float = 0.99,
                         train_fraction: float = 0.5, grid: int = 32, min_support: int = 30) -> dict:
    """Mean and maximum absolute calibration error of Ŝ(b)/Ŝ(a) (probabilities, 0..1)."""
    lengths = np.asarray(output_tokens, dtype=np.float64)
    split = max(1, int(lengths.size * train_fraction))
    train, test = lengths[:split], lengths[split:]
    table = SurvivalTable(delta_tokens, alpha, max_tokens=int(max(lengths.max(), delta_tokens)) + delta_tokens)
    for value in train:
        table.update(value)
    top = float(np.percentile(test, 99.5)) if test.size else 0.0
    points = np.linspace(0.0, top, grid)
    a, b = np.meshgrid(points, points, indexing="ij")
    keep = b > a
    a, b = a[keep], b[keep]
    truth, support = empirical_conditional(test, a, b)
    ok = support >= min_support
    err = np.abs(table.conditional(a[ok], b[ok]) - truth[ok])
    return {"mae": float(err.mean()) if err.size else float("nan"),
            "p95_abs_error": float(np.percentile(err, 95)) if err.size else float("nan"),
            "max_abs_error": float(err.max()) if err.size else float("nan"),
            "grid_cells": int(err.size), "train_requests": int(train.size),
            "test_requests": int(test.size), "delta_tokens": delta_tokens, "alpha": alpha}
