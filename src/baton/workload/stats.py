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


# beyond these a trace's own timestamps more likely carry a unit mistake than a workload
_MAX_PLAUSIBLE_RPS = 1000.0  # no cluster Baton models serves 1,000 requests a second
_DENSE_RPS, _DENSE_GAP_S = 250.0, 0.002  # and a trace this dense, half its gaps under 2 ms, is rare
_MIN_PLAUSIBLE_RPS = 0.01  # one request every 100 s or slower
_WHOLE_GAP_S = 60.0  # whole-number timestamps a minute or more apart: milliseconds, read as seconds?
_MIN_JUDGED = 20  # fewer requests than this say too little about their unit
CAPACITY_MARGIN = 3.0  # a trace's rate beyond this many times the cluster's upper bound


def implausible_rate(requests: list[Request], capacity_rps: float | None = None) -> str | None:
    """Why a trace's own arrival times look like a unit mistake (with the likely fix), or
    None. Judged from what the numbers look like: a rate no cluster serves (or, given
    ``capacity_rps``, an upper bound on what this cluster serves, more than
    ``CAPACITY_MARGIN`` times beyond it), half the gaps under 2 ms at hundreds of requests a
    second, one request every 100 s or slower, or whole-number timestamps minutes apart."""
    if len(requests) < _MIN_JUDGED:
        return None
    arrivals = np.sort(np.array([r.arrival_s for r in requests]))
    span = float(arrivals[-1] - arrivals[0])
    rate = (len(arrivals) - 1) / span if span > 0 else float("inf")
    gap = float(np.median(np.diff(arrivals)))
    head = f"{len(requests):,} requests over {span:,.3f} s is {rate:,.0f} req/s"
    fast = ("are its timestamps in seconds read as milliseconds? (--time-unit s for --columns traces; "
            "--rate R rescales)")
    if rate > _MAX_PLAUSIBLE_RPS:
        return f"{head}, more than any cluster serves: {fast}"
    if capacity_rps is not None and rate > CAPACITY_MARGIN * capacity_rps:
        return (f"{head}, more than {CAPACITY_MARGIN:g}x the most this cluster could serve (about "
                f"{capacity_rps:,.1f} req/s of these requests with every instance at full batch): {fast}")
    if capacity_rps is None and rate > _DENSE_RPS and gap < _DENSE_GAP_S:
        return f"{head}, half of its gaps under {gap * 1e3:.2f} ms: {fast}"
    slow = "are its timestamps in milliseconds read as seconds? (--time-unit ms for --columns traces)"
    if rate < _MIN_PLAUSIBLE_RPS:
        return f"{len(requests):,} requests over {span / 86_400:,.1f} days is {rate:.4f} req/s: {slow}"
    if gap >= _WHOLE_GAP_S and np.all(arrivals == np.round(arrivals)):
        return f"whole-number timestamps with a median gap of {gap:,.0f} s: {slow}"
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
