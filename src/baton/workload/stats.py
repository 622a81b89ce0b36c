"""Length and arrival statistics of a workload."""

from __future__ import annotations

import numpy as np

from baton.core.request import Request


def _dist(values: np.ndarray, unit: str) -> dict[str, float]:
    if values.size == 0:
        return {}
    out = {f"mean_{unit}": float(values.mean())}
    for q in (50, 90, 99):
        out[f"p{q}_{unit}"] = float(np.percentile(values, q))
    out[f"max_{unit}"] = float(values.max())
    return out


def workload_stats(requests: list[Request]) -> dict[str, float]:
    """Counts, rate, inter-arrival burstiness (CV) and length percentiles; units in keys."""
    arrivals = np.array([r.arrival_s for r in requests])
    prompts = np.array([r.prompt_tokens for r in requests], dtype=float)
    outputs = np.array([r.output_tokens for r in requests], dtype=float)
    gaps = np.diff(np.sort(arrivals))
    span = float(arrivals.max() - arrivals.min()) if arrivals.size > 1 else 0.0
    out: dict[str, float] = {
        "requests": len(requests), "duration_s": span,
        "mean_rate_rps": (len(requests) - 1) / span if span > 0 else float("nan"),
        "interarrival_cv": float(gaps.std() / gaps.mean()) if gaps.size and gaps.mean() > 0 else float("nan"),
        "total_prompt_tokens": float(prompts.sum()), "total_output_tokens": float(outputs.sum()),
    }
    out.update({f"prompt_{k}": v for k, v in _dist(prompts, "tokens").items()})
    out.update({f"output_{k}": v for k, v in _dist(outputs, "tokens").items()})
    return out
