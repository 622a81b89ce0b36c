"""Repeats and confidence intervals: a comparison run K times, on K seeds of a synthetic
workload or on K consecutive disjoint windows of a trace, summarised as means and as
paired differences against the first policy with Student-t 95% intervals."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from baton.core.errors import ConfigError
from baton.core.request import Request
from baton.experiments.config import Experiment
from baton.workload import scale_to_rate
from baton.workload.transform import window

MIN_TAIL_SAMPLES = 20
# percentile keys -> (the samples they rest on, the share of samples above them)
PERCENTILE_BASES = {"p95_ttft_s": ("ttft_samples", 0.05), "p99_ttft_s": ("ttft_samples", 0.01),
                    "p99_tpot_s": ("tpot_samples", 0.01), "p99_9_tpot_s": ("tpot_samples", 0.001)}


def repeat_workloads(exp: Experiment, k: int) -> list[tuple[int, list[Request]]]:
    """(seed, requests) for each repeat: K seeds of a synthetic workload, or K consecutive
    disjoint windows of ``workload.requests`` requests of a trace (shifted to start at 0
    and rescaled to ``rate_rps`` when set); one repeat of a trace without ``requests`` is
    the whole trace."""
    if k < 1:
        raise ConfigError(f"--repeats: expected a positive integer, got {k}")
    w = exp.workload
    if not w.trace or (k == 1 and w.requests is None):  # one run of a trace: all of it
        return [(exp.seed + i, w.load(exp.seed + i)) for i in range(k)]
    if w.requests is None:
        raise ConfigError("--repeats/--windows on a trace need --requests N (the window size)")
    full = w.whole_trace(exp.seed)
    if len(full) < k * w.requests:
        raise ConfigError(f"--windows {k} x --requests {w.requests} needs {k * w.requests} requests; "
                          f"the trace has {len(full)}")
    out = []
    for i in range(k):
        part = window(full, i * w.requests, w.requests)
        out.append((exp.seed, scale_to_rate(part, w.rate_rps) if w.rate_rps else part))
    return out


def mean_interval(diffs: np.ndarray) -> tuple[float, float]:
    """The 95% t-interval of a mean over independent samples (NaN with fewer than two)."""
    if diffs.size < 2:
        return (math.nan, math.nan)
    from scipy import stats  # here: scipy.stats costs 0.6 s at import, every CLI call would pay it

    half = stats.t.ppf(0.975, diffs.size - 1) * diffs.std(ddof=1) / math.sqrt(diffs.size)
    mean = float(diffs.mean())
    return (mean - half, mean + half)


def _numeric(summary: Mapping) -> dict[str, float]:
    return {k: float(v) for k, v in summary.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v is not None}


def combine(runs: Mapping[str, Sequence[Mapping[str, float]]]) -> tuple[dict, dict]:
    """(mean summary per policy, paired differences per policy) from K summaries each.
    ``paired[policy][metric] = {"mean_diff": d, "ci95": [lo, hi]}`` against the first
    policy, repeat by repeat (same workload); NaN-only metrics are left out."""
    names = list(runs)
    means, paired = {}, {}
    base = [_numeric(s) for s in runs[names[0]]]
    for name in names:
        reps = [_numeric(s) for s in runs[name]]
        keys = sorted(set().union(*reps))
        means[name] = {k: float(np.nanmean([r.get(k, math.nan) for r in reps]))
                       if any(not math.isnan(r.get(k, math.nan)) for r in reps) else math.nan for k in keys}
        means[name]["repeats"] = len(reps)
        if name == names[0]:
            continue
        paired[name] = {}
        for key in keys:
            d = np.array([r.get(key, math.nan) - b.get(key, math.nan) for r, b in zip(reps, base)])
            d = d[~np.isnan(d)]
            if d.size:
                lo, hi = mean_interval(d)
                paired[name][key] = {"mean_diff": float(d.mean()), "ci95": [lo, hi]}
    return means, paired


def includes_zero(entry: Mapping | None) -> bool:
    """Whether a paired difference's interval includes 0 (no difference shown)."""
    if not entry:
        return False
    lo, hi = entry["ci95"]
    return lo is not None and hi is not None and not (math.isnan(lo) or math.isnan(hi)) and lo <= 0.0 <= hi


def thin_tails(summary: Mapping[str, float]) -> dict[str, float]:
    """Percentiles quoted with fewer than ``MIN_TAIL_SAMPLES`` samples above them: key ->
    the number of samples above (fractional: samples x the tail's share)."""
    out = {}
    for key, (base, share) in PERCENTILE_BASES.items():
        n = summary.get(base)
        if n is not None and not math.isnan(n) and n * share < MIN_TAIL_SAMPLES:
            out[key] = n * share
    return out


def thin_percentiles(summary: Mapping[str, float]) -> list[str]:
    """``thin_tails`` as one warning per percentile."""
    return [f"{key} rests on {above:.1f} samples above it (fewer than {MIN_TAIL_SAMPLES})"
            for key, above in thin_tails(summary).items()]


def _per_policy(by: Mapping[str, float], policies: int) -> str:
    """``a 5.0, b 15.0``; ``13.3 for every policy`` when they all share one figure."""
    figures = {f"{v:.1f}" for v in by.values()}
    if len(by) == policies > 1 and len(figures) == 1:
        return f"{figures.pop()} for every policy"
    return ", ".join(f"{name} {v:.1f}" for name, v in by.items())


def thin_tails_line(runs: Mapping[str, list[Mapping[str, float]]]) -> str | None:
    """One line for a whole comparison (policy -> its repeats' summaries): each thin
    percentile with the fewest samples above it per policy; None when no tail is thin."""
    worst: dict[str, dict[str, float]] = {}
    for name, summaries in runs.items():
        for summary in summaries:
            for key, above in thin_tails(summary).items():
                by = worst.setdefault(key, {})
                by[name] = min(by.get(name, math.inf), above)
    if not worst:
        return None
    parts = [f"{key} ({_per_policy(by, len(runs))})" for key, by in worst.items()]
    return (f"percentiles on fewer than {MIN_TAIL_SAMPLES} samples above them (read them as indicative): "
            + "; ".join(parts))


DROPPED_WARN_SHARE = 0.001  # a policy that rejected more than this share of its requests is named


def unsteady_line(runs: Mapping[str, list[Mapping[str, float]]]) -> str | None:
    """One line when any run (policy -> its repeats' summaries) had no steady window
    (shorter than max(60 s, 10 mean e2e) of arrivals: ``steady`` 0): its attainment and
    latencies measure a burst arriving into an empty cluster, not a sustained load. None
    when every run was steady (or the summaries predate the key)."""
    bad = {name: sum(1 for s in summaries if s.get("steady", 1.0) == 0.0) for name, summaries in runs.items()}
    total = sum(len(summaries) for summaries in runs.values())
    if not any(bad.values()):
        return None
    needed = max(s.get("steady_needed_s", 0.0) for summaries in runs.values() for s in summaries)
    who = ", ".join(f"{name} {n}" for name, n in bad.items() if n)
    return (f"{sum(bad.values())} of {total} runs had no steady window ({who}): their figures measure a burst, "
            f"not a sustained load; a window needs about {needed:.0f} s of arrivals here (more --requests)")


def dropped_line(runs: Mapping[str, list[Mapping[str, float]]]) -> str | None:
    """One line naming each policy (policy -> its repeats' summaries) that rejected more
    than ``DROPPED_WARN_SHARE`` of its requests, with the count by reason (``rejected_<reason>``
    keys, summed over repeats); None when none did. Rejected requests count as SLO misses
    in every figure: a comparison must say how many there were."""
    parts = []
    for name, summaries in runs.items():
        total = sum(s.get("requests", 0) for s in summaries)
        rejected = sum(s.get("rejected", 0) for s in summaries)
        if not total or rejected / total <= DROPPED_WARN_SHARE:
            continue
        reasons: dict[str, float] = {}
        for s in summaries:
            for key, value in s.items():
                if key.startswith("rejected_") and value:
                    reasons[key[len("rejected_"):]] = reasons.get(key[len("rejected_"):], 0) + value
        why = ", ".join(f"{reason} {count:.0f}" for reason, count in sorted(reasons.items()))
        parts.append(f"{name} {rejected:.0f} of {total:.0f} ({100 * rejected / total:.1f}%: {why})")
    return "requests rejected (counted as SLO misses): " + "; ".join(parts) if parts else None
