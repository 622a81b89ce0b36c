"""Summary metrics of a run: latency percentiles, throughput, goodput and SLO attainment
over the steady window (with whole-run ``_makespan`` variants), load balance over time,
migrations and the optimal-assignment ratio."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from baton.core.settings import setting
from baton.metrics.records import RequestRecord
from baton.metrics.tbt import GapHistogram


@dataclass(slots=True, frozen=True)
class SLO:
    """Latency targets: time to first token and time per output token (seconds)."""

    ttft_s: float = setting(2.0, gt=0, unit="s", flag="--ttft-slo", doc="time-to-first-token target")
    tpot_s: float = setting(0.1, gt=0, unit="s", flag="--tpot-slo", doc="time-per-output-token target")


@dataclass(slots=True)
class RunCounters:
    """Counts a runtime accumulates besides per-request records."""

    preemptions: int = 0
    migrations: int = 0
    migrations_refused: int = 0
    migration_bytes: float = 0.0
    transfer_bytes: float = 0.0
    role_changes: int = 0
    handoff_recomputes: int = 0  # stuck KV handoffs given up and recomputed on the decode side
    decode_starts: int = 0
    least_by_count: int = 0    # decode starts on an instance with the fewest other requests
    least_by_tokens: int = 0   # ... with the least other token load
    events: int = 0
    deflections: int = 0  # queued prefills moved onto decode-capable instances (Deflect)
    flip_exposed_requests: int = 0  # requests holding work on an instance when it changed role
    flip_first_work_s: list[float] = field(default_factory=list)  # flip -> first new-role work placed

    def flip_costs(self) -> dict[str, float]:
        """What role changes cost: requests that shared an instance with its new role's
        work, and seconds from a flip to the first work of the new role placed there."""
        waits = self.flip_first_work_s
        nan = float("nan")
        return {"flip_exposed_requests": self.flip_exposed_requests,
                "flip_first_work_mean_s": sum(waits) / len(waits) if waits else nan,
                "flip_first_work_max_s": max(waits) if waits else nan,
                "flips_unused": self.role_changes - len(waits)}

    def oar(self, kind: str) -> float:
        """Optimal-assignment ratio: the share of decode starts on the least loaded decode
        instance, the request itself left out of its own instance's load."""
        hits = self.least_by_count if kind == "count" else self.least_by_tokens
        return hits / self.decode_starts if self.decode_starts else float("nan")


@dataclass(slots=True)
class LoadSeries:
    """Per-instance token load sampled every ``interval_s`` (rows: samples, each a list of
    the instances' loads in tokens; kept as lists because a run may take a sample per
    second of a long simulated day and a small array each costs more than the list)."""

    interval_s: float
    times_s: list[float] = field(default_factory=list)
    rows: list[list[float]] = field(default_factory=list)

    def matrix(self) -> np.ndarray:
        return np.array(self.rows, dtype=np.float64) if self.rows else np.zeros((0, 0))

    def balance(self, columns: list[int] | None = None) -> dict[str, float]:
        """Mean over time of the across-instance variance and coefficient of variation."""
        m = self.matrix()
        if m.size == 0:
            return {"load_variance_tokens2": 0.0, "load_cv": 0.0}
        if columns is not None:
            m = m[:, columns]
        busy = m.sum(axis=1) > 0
        if not busy.any():
            return {"load_variance_tokens2": 0.0, "load_cv": 0.0}
        m = m[busy]
        var = m.var(axis=1)
        mean = m.mean(axis=1)
        return {"load_variance_tokens2": float(var.mean()),
                "load_cv": float((np.sqrt(var) / np.maximum(mean, 1e-9)).mean())}


def _pct(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if values.size else float("nan")


@dataclass(slots=True, frozen=True)
class Window:
    """The steady window, seconds: from ``start_s`` (after the warm-up) to ``end_s`` (the
    last arrival). Metrics over it leave out the ramp-up and the drain."""

    start_s: float
    end_s: float

    @classmethod
    def of(cls, records: list[RequestRecord], warmup_s: float | None = None) -> "Window":
        """Warm-up defaults to 10% of the arrival span; the window ends at the last arrival."""
        if not records:
            return cls(0.0, 0.0)
        first = min(r.arrival_s for r in records)
        last = max(r.arrival_s for r in records)
        warm = 0.1 * (last - first) if warmup_s is None else warmup_s
        return cls(min(first + warm, last), last)

    @property
    def length_s(self) -> float:
        return self.end_s - self.start_s

    def holds(self, r: RequestRecord) -> bool:
        return self.start_s <= r.arrival_s <= self.end_s


def meets_slo(r: RequestRecord, slo: SLO) -> bool:
    """Whether ``r`` finished within its own SLOs where it has them, else the run's."""
    ttft = slo.ttft_s if r.ttft_slo_s != r.ttft_slo_s else r.ttft_slo_s  # NaN: the run's
    tpot = slo.tpot_s if r.tpot_slo_s != r.tpot_slo_s else r.tpot_slo_s
    return r.finished and r.ttft_s <= ttft and (r.output_tokens <= 1 or r.tpot_s <= tpot)


MAX_CLASSES = 8  # per-class figures only while the classes are few (bounded keys)


def class_metrics(records: list[RequestRecord], slo: SLO, window: Window) -> dict[str, float]:
    """Steady-window figures per priority band (``band<P>_...``) and per tenant
    (``tenant_<T>_...``), when a run has more than one of either and at most
    ``MAX_CLASSES``: SLO attainment (by each request's own SLOs), goodput (requests within
    them per second of the window), requests, shed and rejected counts, P99 TTFT and P99
    queueing (arrival to prefill start, flow control's hold included) of those that ran."""
    out: dict[str, float] = {}
    arrived = [r for r in records if window.holds(r)]
    for prefix, key in (("band", lambda r: str(r.priority)), ("tenant_", lambda r: r.tenant)):
        groups: dict[str, list[RequestRecord]] = {}
        for r in arrived:
            groups.setdefault(key(r), []).append(r)
        if not 1 < len(groups) <= MAX_CLASSES:
            continue
        for name, rs in sorted(groups.items()):
            good = sum(1 for r in rs if meets_slo(r, slo))
            out[f"{prefix}{name}_slo_attainment"] = good / len(rs)
            out[f"{prefix}{name}_requests"] = len(rs)
            out[f"{prefix}{name}_shed"] = sum(1 for r in rs if r.reject_reason == "shed")
            out[f"{prefix}{name}_rejected"] = sum(1 for r in rs if not r.finished)
            out[f"{prefix}{name}_goodput_rps"] = good / window.length_s if window.length_s > 0 else float("nan")
            ran = [r for r in rs if r.finished]
            out[f"{prefix}{name}_p99_ttft_s"] = _p99([r.ttft_s for r in ran])
            out[f"{prefix}{name}_p99_queue_s"] = _p99([r.queue_s for r in ran])
    return out


def _p99(values: list[float]) -> float:
    return float(np.percentile(values, 99)) if values else float("nan")


def _tokens_in(done: list[RequestRecord], window: Window) -> float:
    """Output tokens produced inside the window, each request's tokens spread evenly
    between its first token and its end (the first token at its own time)."""
    total = 0.0
    for r in done:
        first, end = r.arrival_s + r.ttft_s, r.arrival_s + r.e2e_s
        if window.start_s <= first <= window.end_s:
            total += 1
        rest = r.output_tokens - 1
        if rest <= 0 or end <= window.start_s or first >= window.end_s:
            continue
        overlap = min(end, window.end_s) - max(first, window.start_s)
        total += rest * (overlap / (end - first) if end > first else 1.0)
    return total


def window_metrics(records: list[RequestRecord], slo: SLO, window: Window) -> dict[str, float]:
    """Steady-window figures. SLO attainment is the share of requests *arriving* in the
    window that meet both SLOs (unfinished and rejected ones miss); goodput is those
    requests per second of window; throughput counts tokens made and requests finished
    inside the window."""
    arrived = [r for r in records if window.holds(r)]
    span = window.length_s if window.length_s > 0 else float("nan")
    done = [r for r in records if r.finished]
    ended = sum(1 for r in done if window.start_s <= r.arrival_s + r.e2e_s <= window.end_s)
    good = sum(1 for r in arrived if meets_slo(r, slo))
    return {"window_start_s": window.start_s, "window_end_s": window.end_s,
            "window_requests": len(arrived),
            "slo_attainment": good / len(arrived) if arrived else float("nan"),
            "goodput_rps": good / span, "throughput_rps": ended / span,
            "throughput_tok_s": _tokens_in(done, window) / span}


MIN_STEADY_S = 60.0  # a steady window holds at least this much of arrivals
STEADY_E2E_MULTIPLE = 10.0  # and this many mean end-to-end latencies


def steadiness(window: Window, mean_e2e_s: float) -> dict[str, float]:
    """Whether the steady window measures load rather than a burst: it must span at least
    ``max(MIN_STEADY_S, STEADY_E2E_MULTIPLE x mean e2e)`` of arrivals (``steady`` 1 or 0,
    with the span it needed, ``steady_needed_s``). A shorter window fits in the cluster at
    once, and a rate that passes on it is not a sustainable rate."""
    e2e = mean_e2e_s if mean_e2e_s == mean_e2e_s else 0.0  # NaN: nothing finished in it
    needed = max(MIN_STEADY_S, STEADY_E2E_MULTIPLE * e2e)
    return {"steady_needed_s": needed, "steady": float(window.length_s >= needed)}


def latency_metrics(done: list[RequestRecord]) -> dict[str, float]:
    """Latency percentiles of finished requests (seconds)."""
    ttft = np.array([r.ttft_s for r in done])
    tpot = np.array([r.tpot_s for r in done if r.output_tokens > 1])
    e2e = np.array([r.e2e_s for r in done])
    queue = np.array([r.queue_s for r in done])
    # waiting on the decode side: for blocks before a handoff could move, then for a slot
    wait = np.array([r.decode_wait_s + (r.receive_wait_s if r.receive_wait_s == r.receive_wait_s else 0.0)
                     for r in done])
    mean = lambda a: float(a.mean()) if a.size else float("nan")  # noqa: E731
    return {"mean_ttft_s": mean(ttft), "p50_ttft_s": _pct(ttft, 50), "p95_ttft_s": _pct(ttft, 95),
            "p99_ttft_s": _pct(ttft, 99), "mean_tpot_s": mean(tpot), "p50_tpot_s": _pct(tpot, 50),
            "p95_tpot_s": _pct(tpot, 95), "p99_tpot_s": _pct(tpot, 99), "p99_9_tpot_s": _pct(tpot, 99.9),
            "mean_e2e_s": mean(e2e), "p99_e2e_s": _pct(e2e, 99),
            "ttft_samples": int(ttft.size), "tpot_samples": int(tpot.size),
            "p50_queue_s": _pct(queue[~np.isnan(queue)], 50), "p50_decode_wait_s": _pct(wait[~np.isnan(wait)], 50)}


def overload(summary: dict[str, float], slo: SLO) -> str | None:
    """A one-line warning when a run is overloaded (steady-window attainment under half,
    or a median TTFT over 10x its SLO), naming the resource that saturated; else None."""
    attain, ttft = summary.get("slo_attainment", 1.0), summary.get("p50_ttft_s", 0.0)
    if not (attain < 0.5 or ttft > 10 * slo.ttft_s):
        return None
    requests = max(summary.get("requests", 1), 1)
    queue, wait = summary.get("p50_queue_s", 0.0), summary.get("p50_decode_wait_s", 0.0)
    if summary.get("preemptions", 0) > 0.1 * requests:
        what = f"KV memory ({summary['preemptions']:.0f} preemptions)"
    elif queue >= wait and queue > slo.ttft_s:
        what = f"prefill capacity (median queueing {queue:.1f} s)"
    elif wait > slo.ttft_s:
        what = f"decode slots or KV (median wait on the decode side for blocks or a slot {wait:.1f} s)"
    else:
        what = "decode throughput (TPOT above its SLO)"
    return (f"overloaded: {attain * 100:.0f}% of the steady window meets the SLO, median TTFT "
            f"{ttft:.1f} s; saturated: {what}")


def summarize(records: list[RequestRecord], tbt: GapHistogram, counters: RunCounters,
              load: LoadSeries, slo: SLO, makespan_s: float,
              decode_columns: list[int] | None = None, warmup_s: float | None = None) -> dict[str, float]:
    """One flat dict of metrics; every key carries its unit. Throughput, goodput, SLO
    attainment and latency percentiles are over the steady window (``Window.of``) and
    its requests; the whole-run figures keep a ``_makespan`` suffix."""
    window = Window.of(records, warmup_s)
    done = [r for r in records if r.finished]
    in_window = [r for r in done if window.holds(r)]
    out_tokens = sum(r.output_tokens for r in done)
    span = makespan_s if makespan_s > 0 else float("nan")
    out: dict[str, float] = {
        "requests": len(records), "finished": len(done), "rejected": len(records) - len(done),
        "throughput_rps_makespan": len(done) / span, "throughput_tok_s_makespan": out_tokens / span,
        "goodput_rps_makespan": sum(1 for r in done if meets_slo(r, slo)) / span,
        "slo_attainment_makespan": sum(1 for r in done if meets_slo(r, slo)) / len(records) if records else 0.0,
        "makespan_s": makespan_s,
        "preemptions": counters.preemptions, "migrations": counters.migrations,
        "migrations_refused": counters.migrations_refused,
        "migration_bytes": counters.migration_bytes, "transfer_bytes": counters.transfer_bytes,
        "role_changes": counters.role_changes, "handoff_recomputes": counters.handoff_recomputes,
        "oar_count": counters.oar("count"), "oar_tokens": counters.oar("tokens"),
        **counters.flip_costs(),
        "deflected_fraction": sum(1 for r in records if r.deflected) / len(records) if records else 0.0,
        "replanned_deflections": counters.deflections,
    }
    for r in records:
        if not r.finished:
            key = f"rejected_{r.reject_reason or 'other'}"
            out[key] = out.get(key, 0) + 1
    out.update(window_metrics(records, slo, window))
    out.update(class_metrics(records, slo, window))
    out.update(latency_metrics(in_window))
    out.update(steadiness(window, out["mean_e2e_s"]))
    out.update(tbt.summary())
    out.update(load.balance(decode_columns))
    return out
