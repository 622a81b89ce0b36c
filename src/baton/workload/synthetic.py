"""Synthetic arrivals and lengths. All generators take a seeded ``numpy.random.Generator``."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from baton.core.errors import ConfigError
from baton.core.settings import setting
from baton.core.request import Request


def poisson_arrivals(n: int, rate_rps: float, rng: np.random.Generator) -> np.ndarray:
    """Arrival times (s) of a Poisson process at ``rate_rps``, first at 0."""
    return gamma_arrivals(n, rate_rps, 1.0, rng)


def gamma_arrivals(n: int, rate_rps: float, cv: float, rng: np.random.Generator) -> np.ndarray:
    """Arrival times (s) with Gamma inter-arrival gaps of mean 1/rate and coefficient of
    variation ``cv`` (cv > 1 is bursty; cv = 1 is Poisson)."""
    if rate_rps <= 0 or cv <= 0:
        raise ConfigError(f"arrivals: rate and cv must be positive, got rate={rate_rps}, cv={cv}")
    shape = 1.0 / (cv * cv)
    gaps = rng.gamma(shape, 1.0 / (rate_rps * shape), size=n)
    gaps[0] = 0.0
    return np.cumsum(gaps)


def fixed_lengths(n: int, tokens: int) -> np.ndarray:
    return np.full(n, tokens, dtype=np.int64)


def uniform_lengths(n: int, low: int, high: int, rng: np.random.Generator) -> np.ndarray:
    """Integers uniform on [low, high] (SIBYL's Random: input U[1,512], output U[1,8192])."""
    return rng.integers(low, high + 1, size=n)


def lognormal_lengths(n: int, median: float, sigma: float, rng: np.random.Generator,
                      cap: int | None = None) -> np.ndarray:
    """Lognormal lengths with the given median and log-space sigma, clipped to [1, cap]."""
    values = np.rint(rng.lognormal(np.log(median), sigma, size=n))
    return np.clip(values, 1, cap if cap else None).astype(np.int64)


def empirical_lengths(n: int, sample: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Resample lengths with replacement from a trace's lengths."""
    return rng.choice(np.asarray(sample), size=n, replace=True).astype(np.int64)


def reasoning_lengths(n: int, cap: int, cap_share: float, median: float, sigma: float,
                      rng: np.random.Generator) -> np.ndarray:
    """Reasoning-model outputs: a share ``cap_share`` runs to the output cap; the rest are
    lognormal (median, sigma) clipped below the cap."""
    at_cap = rng.random(n) < cap_share
    body = lognormal_lengths(n, median, sigma, rng, cap=cap - 1)
    return np.where(at_cap, cap, body).astype(np.int64)


_PROMPTS = ("fixed", "uniform", "lognormal")
_OUTPUTS = (*_PROMPTS, "reasoning")


@dataclass(slots=True, frozen=True)
class SyntheticSpec:
    """A complete synthetic workload description (all lengths in tokens).

    ``arrival``: ``poisson`` or ``gamma`` (with ``cv``). Lengths: ``fixed``, ``uniform``,
    ``lognormal`` or ``reasoning`` for outputs; ``fixed``, ``uniform`` or ``lognormal``
    for prompts.
    """

    requests: int = setting(1000, gt=0, doc="requests to draw")
    rate_rps: float = setting(4.0, gt=0, unit="1/s", doc="mean arrival rate")
    arrival: str = setting("poisson", choices=("poisson", "gamma"), doc="arrival process (gamma: bursty with cv)")
    cv: float = setting(1.0, gt=0, doc="gamma arrivals' coefficient of variation of the gaps (> 1 bursty)")
    prompt: str = setting("lognormal", choices=_PROMPTS, doc="prompt length distribution")
    prompt_median: float = setting(600.0, gt=0, unit="tokens", doc="lognormal (and fixed) prompt median")
    prompt_sigma: float = setting(0.8, ge=0, doc="lognormal prompt sigma (log space)")
    prompt_low: int = setting(1, ge=1, unit="tokens", doc="uniform prompt lower bound")
    prompt_high: int = setting(512, ge=1, unit="tokens", doc="uniform prompt upper bound")
    prompt_cap: int = setting(16384, ge=1, unit="tokens", doc="lognormal prompts clipped here")
    output: str = setting("lognormal", choices=_OUTPUTS, doc="output length distribution (reasoning: a share "
                                                            "runs to the cap)")
    output_median: float = setting(200.0, gt=0, unit="tokens", doc="lognormal, fixed and reasoning output median")
    output_sigma: float = setting(1.0, ge=0, doc="lognormal output sigma (log space)")
    output_low: int = setting(1, ge=1, unit="tokens", doc="uniform output lower bound")
    output_high: int = setting(8192, ge=1, unit="tokens", doc="uniform output upper bound")
    output_cap: int = setting(8192, ge=1, unit="tokens", doc="outputs clipped here (reasoning: the cap they run to)")
    cap_share: float = setting(0.3, ge=0, le=1, doc="reasoning outputs: the share that runs to output_cap")


def _lengths(kind: str, spec: SyntheticSpec, which: str, rng: np.random.Generator) -> np.ndarray:
    n = spec.requests
    get = lambda field: getattr(spec, f"{which}_{field}")  # noqa: E731
    if kind == "fixed":
        return fixed_lengths(n, int(get("median")))
    if kind == "uniform":
        return uniform_lengths(n, get("low"), get("high"), rng)
    if kind == "lognormal":
        return lognormal_lengths(n, get("median"), get("sigma"), rng, cap=get("cap"))
    if kind == "reasoning" and which == "output":
        return reasoning_lengths(n, spec.output_cap, spec.cap_share, spec.output_median,
                                 spec.output_sigma, rng)
    raise ConfigError(f"workload.{which}: unknown length distribution {kind!r}; expected "
                      f"fixed, uniform, lognormal{' or reasoning' if which == 'output' else ''}")


def generate(spec: SyntheticSpec, rng: np.random.Generator) -> list[Request]:
    """Draw a synthetic workload."""
    if spec.requests <= 0:
        raise ConfigError(f"workload.requests: expected a positive integer, got {spec.requests}")
    if spec.arrival == "poisson":
        times = poisson_arrivals(spec.requests, spec.rate_rps, rng)
    elif spec.arrival == "gamma":
        times = gamma_arrivals(spec.requests, spec.rate_rps, spec.cv, rng)
    else:
        raise ConfigError(f"workload.arrival: expected poisson or gamma, got {spec.arrival!r}")
    prompts = _lengths(spec.prompt, spec, "prompt", rng)
    outputs = _lengths(spec.output, spec, "output", rng)
    return [Request(i, float(t), int(max(1, p)), int(max(1, o)))
            for i, (t, p, o) in enumerate(zip(times, prompts, outputs))]


def reasoning_spec(requests: int, rate_rps: float, cap: int = 8192) -> SyntheticSpec:
    """The heavy-tailed reasoning workload used by SIBYL-style experiments: output cap
    ``cap``, about 30% of requests at the cap, mean output about 5,000 tokens at cap 8192."""
    return SyntheticSpec(requests=requests, rate_rps=rate_rps, prompt="uniform", prompt_low=64,
                         prompt_high=1024, output="reasoning", output_cap=cap, cap_share=0.3,
                         output_median=cap * 0.4, output_sigma=0.6)
