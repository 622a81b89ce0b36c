"""How well a fitted model reproduces the profile it was fitted to."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from baton.perf.model import BatchShape, PerfModel
from baton.profiling.grid import ProfileRow


def fit_errors(rows: list[ProfileRow], model: PerfModel) -> dict[str, dict[str, float]]:
    """Per row kind: rows, MAPE and worst relative error of the model's iteration times."""
    errors: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        shape = BatchShape(r.prefill_tokens, r.prefill_attn_pairs, r.decode_requests, r.decode_ctx_tokens)
        errors[r.kind].append(abs(model.iteration_time_s(shape) - r.iteration_s) / r.iteration_s)
    return {kind: {"rows": len(e), "mape": float(np.mean(e)), "max": float(np.max(e))}
            for kind, e in sorted(errors.items())}


def repeat_spread(rows: list[ProfileRow], ctx_tolerance: float = 0.05) -> dict[str, dict[str, float]]:
    """Per row kind: how far apart repeated measurements of one grid point are, as
    (slowest - fastest) / fastest over a point's rows, for points measured at least twice:
    the points, the median spread and the worst. Rows are one point when they share kind,
    prefill and batch size and their decode contexts are within ``ctx_tolerance`` of each
    other (a decode row's context counts the tokens its streams had generated, which
    differ a little between repeats). A quiet machine repeats a point within a few percent;
    a fit's MAPE cannot tell a model's error from this noise."""
    by_shape: dict[tuple, list[tuple[int, float]]] = defaultdict(list)
    for r in rows:
        by_shape[(r.kind, r.prefill_tokens, r.prefill_attn_pairs, r.decode_requests)].append(
            (r.decode_ctx_tokens, r.iteration_s))
    spreads: dict[str, list[float]] = defaultdict(list)
    for key, measured in by_shape.items():
        point: list[float] = []
        last_ctx = None
        for ctx, t in sorted(measured) + [(None, 0.0)]:
            if point and (ctx is None or ctx - last_ctx > ctx_tolerance * max(last_ctx, 1)):
                if len(point) >= 2 and min(point) > 0:
                    spreads[key[0]].append(max(point) / min(point) - 1.0)
                point = []
            point.append(t)
            last_ctx = ctx
    return {kind: {"points": len(s), "median": float(np.median(s)), "max": float(np.max(s))}
            for kind, s in sorted(spreads.items())}
