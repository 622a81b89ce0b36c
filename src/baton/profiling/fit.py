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
