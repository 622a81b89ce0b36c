"""Matching a paper's regime where it leaves a setting unstated.

A reproduction may carry ``match: {metric, target, knob, values, policy, source}``: before the
comparison, the ``knob`` (a setting every policy shares: the engines' ``kv_tokens`` or
``gpu_memory_utilization``, or the workload's ``rate_rps``) is set to the value among
``values`` at which the paper's own baseline figure is matched: ``policy`` (default: the
claim's baseline) on the first repeat's workload, its ``metric`` nearest ``target`` on a
log scale, refined by ``refine`` bisections (default 3) where two grid values bracket it. This matches the paper's setup; it never tunes a policy (the knob applies to
both policies alike), and the report shows the unmatched default beside the matched run.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from baton.core.errors import ConfigError
from baton.experiments.config import Experiment

KNOBS = ("kv_tokens", "gpu_memory_utilization", "rate_rps")


@dataclass(frozen=True, slots=True)
class Match:
    """Which setting to match the paper's baseline figure with, over which values."""

    metric: str
    target: float
    knob: str
    values: tuple[float, ...]
    policy: str | None = None
    source: str = ""
    refine: int = 3  # bisections between the grid values that bracket the target


@dataclass(frozen=True, slots=True)
class Calibration:
    """The knob's chosen value, the baseline's figure there, and every value tried."""

    knob: str
    value: float
    figure: float
    tried: tuple[tuple[float, float], ...]


def parse_match(data: Any, where: str) -> Match | None:
    """A reproduction's ``match`` block; errors name the key."""
    if data is None:
        return None
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: match: expected a mapping")
    unknown = sorted(set(data) - {"metric", "target", "knob", "values", "policy", "source", "refine"})
    if unknown:
        raise ConfigError(f"{where}: match.{unknown[0]}: unknown key")
    for key in ("metric", "target", "knob", "values"):
        if key not in data:
            raise ConfigError(f"{where}: match.{key}: required")
    if data["knob"] not in KNOBS:
        raise ConfigError(f"{where}: match.knob: expected one of {', '.join(KNOBS)}, got {data['knob']!r}")
    target, values = data["target"], data["values"]
    if not isinstance(target, (int, float)) or isinstance(target, bool) or target <= 0:
        raise ConfigError(f"{where}: match.target: expected a positive number, got {target!r}")
    if not isinstance(values, list) or not values or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in values):
        raise ConfigError(f"{where}: match.values: expected a list of positive numbers, got {values!r}")
    refine = data.get("refine", 3)
    if not isinstance(refine, int) or isinstance(refine, bool) or refine < 0:
        raise ConfigError(f"{where}: match.refine: expected a non-negative integer, got {refine!r}")
    return Match(str(data["metric"]), float(target), str(data["knob"]), tuple(float(v) for v in values),
                 str(data["policy"]) if data.get("policy") else None, str(data.get("source", "")), refine)


def with_knob(exp: Experiment, knob: str, value: float) -> Experiment:
    """``exp`` with the knob set for every role (engines) or for the workload (rate)."""
    if knob == "rate_rps":
        wl = exp.workload
        return replace(exp, workload=replace(wl, synthetic=replace(wl.synthetic, rate_rps=value))
                       if not wl.trace and wl.sessions is None else replace(wl, rate_rps=value))
    field_value = int(value) if knob == "kv_tokens" else value
    c = exp.cluster
    engines = {name: replace(getattr(c, name), **{knob: field_value})
               for name in ("engine", "prefill_engine", "decode_engine") if getattr(c, name) is not None}
    return replace(exp, cluster=replace(c, **engines))


def calibrate(match: Match, exp: Experiment, baseline: str,
              measure: Callable[[Experiment, str], Mapping[str, float]]) -> Calibration:
    """The value of ``match.knob`` at which the baseline's metric is nearest the target: the
    grid ``match.values``, then ``match.refine`` bisections between the two neighbouring
    values whose figures bracket the target (the figure is taken to move monotonically
    with the knob between them)."""
    policy = match.policy or baseline

    def figure_at(value: float) -> float:
        return float(measure(with_knob(exp, match.knob, value), policy).get(match.metric, math.nan))

    tried = [(v, figure_at(v)) for v in sorted(match.values)]
    bracket = next(((a, b) for a, b in zip(tried, tried[1:])
                    if _usable(a[1]) and _usable(b[1]) and (a[1] - match.target) * (b[1] - match.target) < 0), None)
    for _ in range(match.refine if bracket else 0):
        (lo, f_lo), (hi, f_hi) = bracket
        mid = (lo + hi) / 2 if match.knob != "kv_tokens" else float(int((lo + hi) / 2))
        if mid in (lo, hi):
            break
        f_mid = figure_at(mid)
        tried.append((mid, f_mid))
        if not _usable(f_mid):
            break
        bracket = ((lo, f_lo), (mid, f_mid)) if (f_lo - match.target) * (f_mid - match.target) < 0 \
            else ((mid, f_mid), (hi, f_hi))
    usable = [(v, f) for v, f in tried if _usable(f)]
    if not usable:
        raise ConfigError(f"match: {policy}'s {match.metric} has no positive value at any of {list(match.values)}")
    value, figure = min(usable, key=lambda vf: abs(math.log(vf[1] / match.target)))
    return Calibration(match.knob, value, figure, tuple(tried))


def _usable(figure: float) -> bool:
    return figure > 0 and math.isfinite(figure)
