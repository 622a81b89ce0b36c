"""Length and arrival statistics of a workload."""

from __future__ import annotations

import numpy as np

from baton.core.prefix import reuse_offered
from baton.core.request import Request


def _dist(values: np.ndarray, unit: str) -> dict[str, float]:
    if values.size == 0:
        return {}
    out = {f"mean_{unit}": float(values.mean())}
    for q in (50, 90, 99):
        out[f"p{q}_{unit}"] = float(np.percentile(values, q))
    out[f"max_{unit}"] = float(values.max())
    return out


def describe(requests: list[Request]) -> str:
    """One line: ``N requests over T s (R req/s); prompt mean/p50/p99 ...; output ...``."""
    s = workload_stats(requests) if requests else {}
    if not s:
        return "0 requests"
    rate = s["mean_rate_rps"]
    return (f"{s['requests']:,} requests over {s['duration_s']:,.1f} s ({rate:,.2f} req/s); prompt mean/p50/p99 "
            f"{s['mean_prompt_tokens']:,.0f}/{s['p50_prompt_tokens']:,.0f}/{s['p99_prompt_tokens']:,.0f} tokens, "
            f"output {s['mean_output_tokens']:,.0f}/{s['p50_output_tokens']:,.0f}/{s['p99_output_tokens']:,.0f}")


# beyond these a trace's rate is more likely a unit mistake than a workload: no cluster
# Baton models serves 1,000 requests a second, and a trace of one request every 100 s
# lasting over a day is rarely what was meant
_MAX_PLAUSIBLE_RPS = 1000.0
_MIN_PLAUSIBLE_RPS, _LONG_S = 0.01, 86_400.0


def implausible_rate(requests: list[Request]) -> str | None:
    """Why a workload's arrival rate looks like a unit mistake (with the likely fix), or None."""
    if len(requests) < 100:
        return None
    s = workload_stats(requests)
    rate, span = s["mean_rate_rps"], s["duration_s"]
    if span == 0 or rate > _MAX_PLAUSIBLE_RPS:
        return (f"{len(requests):,} requests over {span:,.3f} s is {rate:,.0f} req/s, more than any cluster "
                "serves: are its timestamps in seconds read as milliseconds? (--time-unit s for --columns "
                "traces; --rate R rescales)")
    if rate < _MIN_PLAUSIBLE_RPS and span > _LONG_S:
        return (f"{len(requests):,} requests over {span / 86_400:,.1f} days is {rate:.4f} req/s: are its "
                "timestamps in milliseconds read as seconds? (--time-unit ms for --columns traces)")
    return None


REUSE_BLOCK_TOKENS = 16  # vLLM's default block size: reuse is counted in its full blocks


def workload_stats(requests: list[Request], cache_tokens: int = 500_000) -> dict[str, float]:
    """Counts, rate, inter-arrival burstiness (CV) and length percentiles; units in keys.
    With prefix identity (``Request.prefix_ids``), also the reuse it offers: the share of
    prompt blocks a prefix cache could serve, remembering everything
    (``prefix_reuse_share``) and remembering ``cache_tokens`` tokens, least recently used
    forgotten first (``prefix_reuse_share_cached``)."""
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
    out.update(_dist(prompts, "prompt_tokens"))
    out.update(_dist(outputs, "output_tokens"))
    if any(r.prefix_ids for r in requests):
        out["prefix_reuse_share"] = reuse_offered(requests, REUSE_BLOCK_TOKENS)
        out["prefix_reuse_share_cached"] = reuse_offered(requests, REUSE_BLOCK_TOKENS,
                                                         cache_tokens // REUSE_BLOCK_TOKENS)
        out["reuse_cache_tokens"] = cache_tokens
    return out
