"""Workload transforms: rate change by time scaling (Arrow's method), clipping."""

from __future__ import annotations

from dataclasses import replace

from baton.core.errors import ConfigError
from baton.core.request import Request


def mean_rate_rps(requests: list[Request]) -> float:
    """Average arrival rate over the trace's span (requests per second)."""
    if len(requests) < 2:
        return 0.0
    span = requests[-1].arrival_s - requests[0].arrival_s
    return (len(requests) - 1) / span if span > 0 else float("inf")


def scale_to_rate(requests: list[Request], rate_rps: float) -> list[Request]:
    """Rescale arrival times so the average rate is ``rate_rps``; burst shape is kept."""
    if rate_rps <= 0:
        raise ConfigError(f"rate: expected a positive number, got {rate_rps}")
    current = mean_rate_rps(requests)
    if current in (0.0, float("inf")):
        if len(requests) <= 1:
            return list(requests)
        raise ConfigError("rate: every request arrives at the same instant, so there is no rate to "
                          "rescale; --rate never invents arrivals (use --arrivals poisson:R|uniform:R "
                          "for a trace without arrival times)")
    factor = current / rate_rps
    return [replace(r, arrival_s=r.arrival_s * factor) for r in requests]


def first(requests: list[Request], n: int) -> list[Request]:
    """Keep the first ``n`` requests."""
    if n <= 0:
        raise ConfigError(f"requests: expected a positive integer, got {n}")
    return requests[:n]


def window(requests: list[Request], start: int, n: int) -> list[Request]:
    """Requests ``[start, start + n)`` (fewer where the list ends), shifted so the first
    arrives at 0 and numbered 0.. (one part of a trace, as an evaluation's repeat runs it)."""
    part = requests[start:start + n]
    if not part:
        return []
    t0 = part[0].arrival_s
    return [replace(r, req_id=i, arrival_s=r.arrival_s - t0) for i, r in enumerate(part)]


def clip_window(requests: list[Request], start_s: float, end_s: float) -> list[Request]:
    """Keep requests arriving in [start_s, end_s), shifted to start at 0."""
    kept = [r for r in requests if start_s <= r.arrival_s < end_s]
    return [replace(r, arrival_s=r.arrival_s - start_s) for r in kept]


def clip_lengths(requests: list[Request], max_prompt_tokens: int | None = None,
                 max_output_tokens: int | None = None) -> list[Request]:
    """Truncate prompt and output lengths to the given maxima."""
    return [replace(r, prompt_tokens=min(r.prompt_tokens, max_prompt_tokens or r.prompt_tokens),
                    output_tokens=min(r.output_tokens, max_output_tokens or r.output_tokens))
            for r in requests]


def renumber(requests: list[Request]) -> list[Request]:
    """Sort by arrival and give ids 0..n-1."""
    ordered = sorted(requests, key=lambda r: r.arrival_s)
    return [replace(r, req_id=i) for i, r in enumerate(ordered)]
