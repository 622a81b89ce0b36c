"""Rate sweeps: every (policy, rate) point is an independent seeded simulation, run in
local processes (default), in this process, or on a Ray cluster. The seed fixes the
result, so all three give identical numbers."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from baton.core.errors import ConfigError
from baton.experiments.config import Experiment
from baton.experiments.steady import CAPPED, KNEE, Sustained, steady_point, sustained
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
        """Each policy's max sustainable rate (None: below the range, or not measurable)."""
        return {name: (k.rate_rps if k.status in (KNEE, CAPPED) else None) for name, k in self.knees().items()}

    def knees(self) -> dict[str, Sustained]:
        """Each policy's max sustainable rate and what it is (``steady.Sustained``)."""
        return {name: sustained(self.rates_rps, pts, self.target_attainment) for name, pts in self.points.items()}


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


def run_point(exp: Experiment, rate_rps: float, target: float = 0.9) -> dict[str, float]:
    """Simulate ``exp`` with its arrivals rescaled to ``rate_rps`` on a steady window
    (``steady.steady_point``: at least its own request count, and enough requests for 60 s
    and 10 mean e2e of steady arrivals; a trace gives at most all it holds); the summary."""
    wl = exp.workload
    base = wl.requests or (wl.synthetic.requests if wl.drawn else 10**9)  # a trace: all of it

    def run(n: int) -> dict[str, float]:
        point = replace(exp, workload=replace(wl, rate_rps=rate_rps, requests=n))
        requests = point.workload.load(point.seed)
        result = simulate(requests, point.cluster, point.policy, seed=point.seed, info=point.view, slo=point.slo,
                          extras=extras_for(point.policy, point.cluster.preset))
        summary = result.summary(point.slo, point.warmup_s)
        return {k: v for k, v in summary.items() if k not in VOLATILE_KEYS}
    return {**steady_point(run, rate_rps, base, target, exp.warmup_s), "rate_rps": rate_rps}


Point = tuple[str, int, Experiment, float, float]  # policy, rate index, experiment, rate, target


def _serial(points: list[Point], done: Callable[[Point, dict], None], workers: int) -> None:
    for p in points:
        done(p, run_point(*p[2:]))


def _processes(points: list[Point], done: Callable[[Point, dict], None], workers: int) -> None:
    from concurrent.futures import ProcessPoolExecutor, as_completed  # a pool only where a sweep runs one
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(run_point, *p[2:]): p for p in points}
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
    refs = {remote.remote(*p[2:]): p for p in points}
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
    points = [(name, i, replace(base, policy=pol), rate, target_attainment)
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
