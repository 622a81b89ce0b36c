"""Rate sweeps: every (policy, rate) point is an independent seeded simulation, run in
local processes (default), in this process, or on a Ray cluster. The seed fixes the
result, so all three give identical numbers."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from typing import Any

from baton.core.errors import ConfigError
from baton.experiments.config import Experiment
from baton.profiling.qoe import extras_for
from baton.sim import simulate

# Host-dependent figures, left out so that results compare exactly across executors.
VOLATILE_KEYS = ("wall_s",)


@dataclass(slots=True)
class SweepResult:
    """Per policy, the summaries of its points in increasing rate order."""

    rates_rps: list[float]
    target_attainment: float
    points: dict[str, list[dict[str, float]]] = field(default_factory=dict)

    def series(self, policy: str, key: str) -> list[float]:
        return [p[key] for p in self.points[policy]]

    def max_rates_rps(self) -> dict[str, float | None]:
        return {name: max_sustainable_rate(self.rates_rps, self.series(name, "slo_attainment"),
                                           self.target_attainment) for name in self.points}


def max_sustainable_rate(rates_rps: Sequence[float], attainment: Sequence[float],
                         target: float = 0.9) -> float | None:
    """The highest rate (req/s) at which SLO attainment stays at or above ``target``,
    interpolated linearly where the curve first crosses it. None when even the lowest
    rate misses the target; the highest rate swept when none misses it."""
    if not rates_rps or attainment[0] < target:
        return None
    for i in range(1, len(rates_rps)):
        if attainment[i] < target:
            r0, r1, a0, a1 = rates_rps[i - 1], rates_rps[i], attainment[i - 1], attainment[i]
            return float(r0 + (a0 - target) / (a0 - a1) * (r1 - r0))
    return float(rates_rps[-1])


def run_point(exp: Experiment, rate_rps: float) -> dict[str, float]:
    """Simulate ``exp`` with its arrivals rescaled to ``rate_rps``; returns the summary."""
    exp = replace(exp, workload=replace(exp.workload, rate_rps=rate_rps))
    requests = exp.workload.load(exp.seed)
    result = simulate(requests, exp.cluster, exp.policy, seed=exp.seed, info=exp.view, slo=exp.slo,
                      extras=extras_for(exp.policy, exp.cluster.preset))
    summary = result.summary(exp.slo, exp.warmup_s)
    summary = {k: v for k, v in summary.items() if k not in VOLATILE_KEYS}
    summary["rate_rps"] = rate_rps
    return summary


Point = tuple[str, int, Experiment, float]


def _serial(points: list[Point], done: Callable[[Point, dict], None], workers: int) -> None:
    for p in points:
        done(p, run_point(p[2], p[3]))


def _processes(points: list[Point], done: Callable[[Point, dict], None], workers: int) -> None:
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(run_point, p[2], p[3]): p for p in points}
        for fut in as_completed(futures):
            done(futures[fut], fut.result())


def _ray(points: list[Point], done: Callable[[Point, dict], None], address: str | None) -> None:
    try:
        import ray
    except ImportError:
        raise ConfigError("--ray needs Ray installed: pip install -e '.[ray]'") from None
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=False,
                 configure_logging=False)
    remote = ray.remote(run_point)
    refs = {remote.remote(p[2], p[3]): p for p in points}
    pending = list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        done(refs[ready[0]], ray.get(ready[0]))


def run_sweep(base: Experiment, policies: Mapping[str, str | Mapping[str, Any]],
              rates_rps: Sequence[float], executor: str = "processes", workers: int | None = None,
              ray_address: str | None = None, target_attainment: float = 0.9,
              on_point: Callable[[str, float], None] | None = None) -> SweepResult:
    """Run every named policy at every rate. ``executor`` is "processes", "serial" or "ray"."""
    rates = sorted(float(r) for r in rates_rps)
    if not rates or rates[0] <= 0:
        raise ConfigError(f"--rates: expected positive request rates, got {list(rates_rps)}")
    names = list(policies)
    points = [(name, i, replace(base, policy=pol), rate)
              for name, pol in policies.items() for i, rate in enumerate(rates)]
    slots: dict[str, list[dict | None]] = {n: [None] * len(rates) for n in names}

    def done(point: Point, summary: dict) -> None:
        slots[point[0]][point[1]] = summary
        if on_point:
            on_point(point[0], point[3])

    if executor == "ray":
        _ray(points, done, ray_address)
    elif executor == "serial" or workers == 1:
        _serial(points, done, 1)
    else:
        _processes(points, done, workers or min(len(points), os.cpu_count() or 1))
    return SweepResult(rates, target_attainment, {n: list(v) for n, v in slots.items()})
